"""TieredTrainPipeline: TorchRec's prefetching train pipeline, made to run on the CPU.

``PrefetchTrainPipelineSparseDist`` issues each sharded module's ``prefetch()`` for batch
i+1 after the input dist and the forward of batch i, so the tier I/O of batch i+1 overlaps
batch i's backward and optimizer; but its prefetch step assumes CUDA streams and skips
every module on the CPU, where its pipelined forward then fails ("Invalid
PrefetchPipelinedForward usage"), all-FUSED models included. This subclass does that
step without streams: the tiered kernels' background prefetch gives the overlap.
"""

from __future__ import annotations

from torchrec.distributed.train_pipeline.pipeline_context import (
    PrefetchTrainPipelineContext,
)
from torchrec.distributed.train_pipeline.train_pipelines import (
    PrefetchTrainPipelineSparseDist,
)

__all__ = ["TieredTrainPipeline"]


class TieredTrainPipeline(PrefetchTrainPipelineSparseDist):
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
