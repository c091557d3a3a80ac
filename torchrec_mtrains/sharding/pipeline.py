"""TieredTrainPipeline: TorchRec's prefetching train pipeline, made to run on the CPU, and
deep enough for the tiered kernels' look-ahead window.

``PrefetchTrainPipelineSparseDist`` issues each sharded module's ``prefetch()`` for batch
i+1 after the input dist and the forward of batch i, so the tier I/O of batch i+1 overlaps
batch i's backward and optimizer; but its prefetch step assumes CUDA streams and skips
every module on the CPU, where its pipelined forward then fails ("Invalid
PrefetchPipelinedForward usage"), all-FUSED models included. This subclass does that
step without streams: the tiered kernels' background prefetch gives the overlap.

``lookahead=k`` (k > 0) keeps k + 1 batches prefetched ahead of the one computed, so a
kernel with a look-ahead window of k (``TieredParams.lookahead``) plans each batch knowing
the k after it: the pipeline holds k + 2 batches (their ids and input dists), and prefetches
batch i+k+1 before the forward of batch i (its input dist was waited for then already). The
outputs are those of ``lookahead=0``: the window changes which rows stay cached only.
"""

from __future__ import annotations

from typing import Any, Iterator, cast

from torch.autograd.profiler import record_function
from torchrec.distributed.train_pipeline.pipeline_context import (
    PrefetchTrainPipelineContext,
)
from torchrec.distributed.train_pipeline.train_pipelines import (
    PrefetchTrainPipelineSparseDist,
)
from torchrec.distributed.train_pipeline.utils import _wait_for_batch

from torchrec_mtrains.kernels.config import MAX_LOOKAHEAD

__all__ = ["TieredTrainPipeline"]


class TieredTrainPipeline(PrefetchTrainPipelineSparseDist):
    """``PrefetchTrainPipelineSparseDist``'s arguments, and ``lookahead``: batches the tiered
    kernels may look ahead (0: TorchRec's pipeline, one batch prefetched).

    Raises:
        ValueError: ``lookahead`` not an integer in [0, MAX_LOOKAHEAD].
    """

    def __init__(self, *args: Any, lookahead: int = 0, **kwargs: Any) -> None:
        if isinstance(lookahead, bool) or not isinstance(lookahead, int) or not 0 <= lookahead <= MAX_LOOKAHEAD:
            raise ValueError(f"lookahead={lookahead!r} must be an integer in [0, {MAX_LOOKAHEAD}]")
        super().__init__(*args, **kwargs)
        self.lookahead = lookahead

    def _prefetch(self, context: PrefetchTrainPipelineContext) -> None:
        if self._data_dist_stream is not None:  # a GPU: TorchRec's own stream handling
            super()._prefetch(context)
            return
        context.module_input_post_prefetch.clear()
        context.module_contexts_post_prefetch.clear()
        for module in self._pipelined_modules:
            name = module.forward._name
            dist_input = context.input_dist_tensors_requests.pop(name).wait()
            module_context = context.module_contexts[name]
            module.prefetch(ctx=module_context, dist_input=dist_input, forward_stream=None)
            context.module_input_post_prefetch[name] = dist_input
            context.module_contexts_post_prefetch[name] = context.module_contexts.pop(name)

    def fill_pipeline(self, dataloader_iter: Iterator[Any]) -> None:
        if not self.lookahead:
            super().fill_pipeline(dataloader_iter)
            return
        depth = self.lookahead + 1  # batches prefetched ahead of the one computed
        if len(self.batches) >= depth + 1 or (self.batches and self._execute_all_batches):
            return
        if not self.enqueue_batch(dataloader_iter):
            return
        self._init_pipelined_modules(self.batches[0], self.contexts[0], self._pipelined_forward_type)
        self.wait_sparse_data_dist(self.contexts[0])
        self._prefetch(cast(PrefetchTrainPipelineContext, self.contexts[0]))
        for j in range(1, depth + 1):
            if not self.enqueue_batch(dataloader_iter):
                return
            self.start_sparse_data_dist(self.batches[j], self.contexts[j])
            if j < depth:  # the last one is prefetched by the first progress()
                self.wait_sparse_data_dist(self.contexts[j])
                self._prefetch(cast(PrefetchTrainPipelineContext, self.contexts[j]))

    def progress(self, dataloader_iter: Iterator[Any]) -> Any:
        if not self.lookahead:
            return super().progress(dataloader_iter)
        depth = self.lookahead + 1
        self.fill_pipeline(dataloader_iter)
        if not self.batches:
            raise StopIteration
        self._set_module_context(self.contexts[0])
        if self._model.training:
            with record_function("## zero_grad ##"):
                self._optimizer.zero_grad()
        with record_function("## wait_for_batch ##"):
            _wait_for_batch(self.batches[0], self._prefetch_stream)
        self.enqueue_batch(dataloader_iter)  # batch i+depth+1
        if len(self.batches) > depth:
            # Batch i+depth before batch i's forward: the kernels plan batch i+1 with its
            # whole window while batch i computes.
            self.wait_sparse_data_dist(self.contexts[depth])
            self._prefetch(cast(PrefetchTrainPipelineContext, self.contexts[depth]))
        with record_function("## forward ##"):
            losses, output = self._model_fwd(self.batches[0])
        context = cast(PrefetchTrainPipelineContext, self.contexts[0])
        context.module_input_post_prefetch.clear()
        context.module_contexts_post_prefetch.clear()
        if self._model.training:
            with record_function("## backward ##"):
                losses.sum(dim=0).backward()
            with record_function("## optimizer ##"):
                self._optimizer.step()
        if len(self.batches) > depth + 1:
            self.start_sparse_data_dist(self.batches[depth + 1], self.contexts[depth + 1])
        self.dequeue_batch()
        return output
