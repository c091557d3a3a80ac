"""torchrec_mtrains.commands.quiet: the framework warnings the entry points silence, each by its
message and the module that issues it."""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist

from torchrec_mtrains.commands.quiet import quiet_framework_noise


def _row_wise_collectives() -> None:
    """The calls TorchRec's comm_ops make for row-wise tables (reduce-scatter forward,
    all-gather backward), through torch's public functions as TorchRec calls them."""
    out, inp = torch.zeros(2), torch.ones(2)
    dist.reduce_scatter_tensor(out, inp)
    dist.all_gather_into_tensor(out, inp)


def test_row_wise_collectives_warn_without_the_filter(process_group) -> None:
    # The check below would pass vacuously if this torch no longer warned: it does, from
    # torch.distributed.c10d_logger (its deprecation wrapper sits inside the c10d logger).
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _row_wise_collectives()
    messages = sorted(str(w.message).split(" is deprecated")[0] for w in caught if w.category is FutureWarning)
    assert messages == ["`torch.distributed.all_gather_into_tensor`", "`torch.distributed.reduce_scatter_tensor`"]
    assert all(w.filename.endswith("c10d_logger.py") for w in caught)


def test_quiet_drops_the_row_wise_collectives_deprecations(process_group) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_framework_noise()
        _row_wise_collectives()
    assert [str(w.message) for w in caught] == []


def test_quiet_keeps_other_warnings_of_the_same_module() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_framework_noise()
        warnings.warn_explicit("`torch.distributed.something_else` is deprecated", FutureWarning,
                               "c10d_logger.py", 1, module="torch.distributed.c10d_logger")
        warnings.warn_explicit("`torch.distributed.reduce_scatter_tensor` is deprecated", FutureWarning,
                               "ours.py", 1, module="torchrec_mtrains.ours")
    assert len(caught) == 2
