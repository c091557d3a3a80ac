"""examples/dlrm with --virtual-tables: the large tables become virtual tables fed raw ids
(each id its own row), launched with torchx on 2 gloo ranks; and what it refuses."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from tests.examples.test_example_dlrm import _env, _metrics, _torchx
from tests.support.paths import EXAMPLE_DLRM, REPO_ROOT, add_example_to_path

add_example_to_path()
from data import RAW_ID_BITS, DEFAULT_TABLES, SyntheticData, raw_ids  # noqa: E402

STEPS = 30


@pytest.mark.slow
@pytest.mark.multiprocess
def test_virtual_tables_train_on_two_ranks(tmp_path) -> None:
    out = tmp_path / "out"
    proc = _torchx("dist.ddp", "-j", "1x2", "--script", "examples/dlrm/train.py", "--", "--virtual-tables",
                   "--steps", str(STEPS), "--out", str(out))
    assert "Job finished: SUCCEEDED" in proc.stderr + proc.stdout, proc.stderr[-4000:]
    m = _metrics(out)
    large = sorted(t.name for t in DEFAULT_TABLES if t.num_rows >= 500_000)
    assert m["virtual_tables"] == large
    assert m["losses"][-1] < m["losses"][0] and m["auc"] > 0.6
    shards = m["tiers"]["shards"]
    for name in large:
        mine = [s for shard, s in shards.items() if shard.startswith(name + ".")]
        assert len(mine) == 2, f"{name}: row-wise by buckets, a shard a rank"
        assert all(s["virtual_live_ids"] > 0 for s in mine)
        assert all(s["virtual_index_bytes_per_row_used"] <= 16.0 for s in mine)


def test_raw_ids_keep_distinct_rows_distinct() -> None:
    rows = np.arange(2_000_000, dtype=np.int64)
    ids = raw_ids(rows, 7)
    assert np.unique(ids).size == rows.size
    assert ids.min() >= 0 and ids.max() < 2**RAW_ID_BITS
    assert ids.max() > 2 ** (RAW_ID_BITS - 2), "spread over the whole space"
    data = SyntheticData(DEFAULT_TABLES[:2], 64, seed=1, raw_id_tables=[DEFAULT_TABLES[0].name])
    kjt = data.batch(0, 0).sparse_features.to_dict()
    assert int(kjt[f"f_{DEFAULT_TABLES[0].name}"].values().max()) >= DEFAULT_TABLES[0].num_rows
    assert int(kjt[f"f_{DEFAULT_TABLES[1].name}"].values().max()) < DEFAULT_TABLES[1].num_rows


def test_virtual_tables_refuse_what_they_do_not_support(tmp_path) -> None:
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(EXAMPLE_DLRM / "train.py"), "--virtual-tables", "--weights-checksum",
                           "--out", str(out)], cwd=REPO_ROOT, env=_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "--virtual-tables does not work with --weights-checksum" in proc.stderr
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.multiprocess
def test_virtual_tables_resume_from_a_checkpoint_as_if_never_stopped(tmp_path) -> None:
    """A run saves at step 10 (the pipeline has prefetched step 11 then) and goes on to 16;
    another resumes from that step: the same losses, step by step."""
    def run(name: str, *extra: str) -> dict:
        out = tmp_path / name
        proc = _torchx("dist.ddp", "-j", "1x2", "--script", "examples/dlrm/train.py", "--", "--virtual-tables",
                       "--steps", "16", "--checkpoint-dir", str(tmp_path / "ck"), "--out", str(out), *extra)
        assert "Job finished: SUCCEEDED" in proc.stderr + proc.stdout, proc.stderr[-4000:]
        return _metrics(out)

    whole = run("whole", "--checkpoint-every", "10")
    resumed = run("resumed", "--resume")
    assert [c["step"] for c in whole["checkpoints"]] == [10]
    assert resumed["losses"] == whole["losses"]
