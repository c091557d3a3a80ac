"""Framework warnings that the user of ``mtrains`` and of the example can do nothing about,
silenced where they are issued: each by its message and the module that issues it, never a
whole category or module. Entry points (``mtrains``, examples/dlrm/train.py) call
``quiet_framework_noise()``; importing the library changes no filter.

Warnings that our own calls trigger are fixed at the call instead (e.g. the launchers set
``OMP_NUM_THREADS`` so that torchrun does not warn that it picked one).
"""

from __future__ import annotations

import logging
import warnings

__all__ = ["quiet_framework_noise"]

# warnings.warn calls: (message regex, category, regex of the module the warning names).
_WARNINGS = (
    # TorchRec's DistributedModelParallel wraps the dense part in DDP with
    # broadcast_buffers=False, which torch deprecates; TorchRec has to keep it until DDP
    # gains init_sync_buffers (the warning's own advice), and no argument of DMP avoids it.
    (r"`broadcast_buffers` is deprecated", FutureWarning, r"torchrec\.distributed\.model_parallel"),
    # Row-wise sharding: TorchRec's comm_ops (reduce-scatter of the pooled rows forward, its
    # all-gather backward) call the collectives torch renamed to *_single. torch's
    # deprecation wrapper sits inside its c10d logger, so the warning names that module.
    (r"`torch\.distributed\.reduce_scatter_tensor` is deprecated", FutureWarning,
     r"torch\.distributed\.c10d_logger"),
    (r"`torch\.distributed\.all_gather_into_tensor` is deprecated", FutureWarning,
     r"torch\.distributed\.c10d_logger"),
)
# logging records: (logger name, start of the message).
_LOG_RECORDS = (
    # torch.fx logs this once per process when TorchRec builds a KeyedJaggedTensor (its
    # metaclass asks torch.fx whether it is tracing): advice for torch.fx callers, not us.
    ("torch.fx._symbolic_trace", "is_fx_tracing will return true"),
)


class _DropMessage(logging.Filter):
    """Drops the records whose message starts with ``prefix``."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefix)


def quiet_framework_noise() -> None:
    """Installs the filters above (once per process: calling again adds none)."""
    for message, category, module in _WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
    for name, prefix in _LOG_RECORDS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropMessage) and f.prefix == prefix for f in logger.filters):
            logger.addFilter(_DropMessage(prefix))
