"""Traces from TorchRec input: an iterator of KeyedJaggedTensors, one per training step."""

from __future__ import annotations

from typing import Dict, Iterable, List, Mapping, Optional

import numpy as np
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from torchrec_mtrains.stats.types import TableTrace, Trace

__all__ = ["trace_from_kjts"]


def trace_from_kjts(
    batches: Iterable[KeyedJaggedTensor],
    feature_to_table: Optional[Mapping[str, str]] = None,
    num_rows: Optional[Mapping[str, int]] = None,
) -> Trace:
    """Collects a trace from one KJT per training step.

    Args:
        batches: KJTs (keys = features); each is one step. Features of one table (TorchRec's
            ``EmbeddingBagConfig.feature_names``) are merged into that table's step.
        feature_to_table: table of each feature (default: each feature is its own table).
            Features not in the map raise ValueError.
        num_rows: rows of each table, if known.

    Raises:
        ValueError: a batch that is not a KJT, a feature without a table, negative ids.
    """
    per_table: Dict[str, List[np.ndarray]] = {}
    offsets: Dict[str, List[int]] = {}
    samples: List[int] = []
    step = 0
    for step, kjt in enumerate(batches):
        if not isinstance(kjt, KeyedJaggedTensor):
            raise ValueError(f"batches[{step}] must be a KeyedJaggedTensor, got {type(kjt).__name__}")
        step_ids: Dict[str, List[np.ndarray]] = {}
        for key, jt in kjt.to_dict().items():
            table = key if feature_to_table is None else feature_to_table.get(key)
            if table is None:
                raise ValueError(f"batches[{step}]: feature {key!r} has no table in feature_to_table")
            values = jt.values()
            if values.is_floating_point():
                raise ValueError(f"batches[{step}]: values of feature {key!r} must be integer ids, got {values.dtype}")
            v = values.detach().to(torch.int64).cpu().numpy()
            if v.size and v.min() < 0:
                raise ValueError(f"batches[{step}]: feature {key!r} has negative id {int(v.min())}")
            step_ids.setdefault(table, []).append(v)
        for table in set(per_table) | set(step_ids):
            if table not in per_table:  # first seen now: earlier steps had no ids for it
                per_table[table] = []
                offsets[table] = [0] * (len(samples) + 1)
            got = np.concatenate(step_ids[table]) if table in step_ids else np.zeros(0, dtype=np.int64)
            per_table[table].append(got)
            offsets[table].append(offsets[table][-1] + got.size)
        samples.append(int(kjt.stride()))
    sample_arr = np.asarray(samples, dtype=np.int64)
    tables = {}
    for table in sorted(per_table):
        rows = None if num_rows is None else num_rows.get(table)
        ids = np.concatenate(per_table[table]) if per_table[table] else np.zeros(0, dtype=np.int64)
        tables[table] = TableTrace(ids, np.asarray(offsets[table], dtype=np.int64), sample_arr, rows)
    return Trace(tables)
