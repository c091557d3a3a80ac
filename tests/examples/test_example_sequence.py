"""examples/sequence: a small sequence recommender (TorchRec's EmbeddingCollection) on tiered
tables, launched with torchx on 2 gloo ranks; its synthetic histories and what it refuses."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from tests.examples.test_example_dlrm import _env, _metrics, _torchx
from tests.support.paths import REPO_ROOT

SCRIPT = REPO_ROOT / "examples" / "sequence" / "train.py"


@pytest.mark.slow
@pytest.mark.multiprocess
def test_sequence_model_trains_on_tiers_on_two_ranks(tmp_path) -> None:
    out = tmp_path / "out"
    proc = _torchx("examples/sequence/component.py:sequence", "--", "--steps", "60", "--out", str(out))
    assert "Job finished: SUCCEEDED" in proc.stderr + proc.stdout, proc.stderr[-4000:]
    m = _metrics(out)
    assert m["world_size"] == 2 and len(m["losses"]) == 60
    assert np.mean(m["losses"][-10:]) < np.mean(m["losses"][:10]) and m["auc"] > 0.55
    # The default budgets leave DRAM only for caches: the item table is on SCM or SSD.
    assert m["placement"]["item"]["tier"] in ("SCM", "SSD")
    shards = {name: s for name, s in m["tiered"].items() if name.startswith("item.")}
    assert shards and all(s["lookups"] > 0 and 0 < s["hit_rate"] <= 1 for s in shards.values())
    assert m["history_length"]["max"] > 10 * m["history_length"]["mean"], "long-tailed histories"


def test_histories_are_long_tailed_and_deterministic() -> None:
    import importlib.util

    # By path: "train" may already be the DLRM example's module in this process.
    spec = importlib.util.spec_from_file_location("mtrains_sequence_train", SCRIPT)
    sequence_train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sequence_train)
    args = sequence_train.parse_args(["--items", "50000", "--users", "1000", "--batch-size", "512"])
    data = sequence_train.SequenceData(args)
    a, b = data.batch(3, 1), data.batch(3, 1)
    assert a.sparse_features.values().equal(b.sparse_features.values())
    lengths = a.sparse_features.to_dict()["history"].lengths()
    assert int(lengths.min()) >= 1 and int(lengths.max()) <= args.max_length
    assert 0.5 * args.mean_length < float(lengths.float().mean()) < 2 * args.mean_length
    assert int(lengths.max()) > 5 * args.mean_length
    assert int(a.sparse_features.values().max()) < args.items


@pytest.mark.slow
@pytest.mark.multiprocess
def test_sequence_model_trains_its_item_table_with_adam(tmp_path) -> None:
    """BERT4Rec's optimizer on the tiers: the item table (on SCM or SSD) trains with Adam."""
    out = tmp_path / "out"
    proc = _torchx("examples/sequence/component.py:sequence", "--", "--steps", "40", "--optimizer", "adam",
                   "--out", str(out))
    assert "Job finished: SUCCEEDED" in proc.stderr + proc.stdout, proc.stderr[-4000:]
    m = _metrics(out)
    assert m["optimizer"] == "adam" and m["learning_rate"] == 0.001
    assert np.mean(m["losses"][-10:]) < np.mean(m["losses"][:10])
    assert m["placement"]["item"]["tier"] in ("SCM", "SSD")


@pytest.mark.parametrize("flags, match", [(["--embedding-dim", "6"], "multiple of 4"),
                                          (["--optimizer", "shampoo"], "--optimizer"),
                                          (["--learning-rate", "0"], "--learning-rate"),
                                          (["--mean-length", "5000"], "--mean-length"),
                                          (["--dram-budget", "lots"], "--dram-budget")])
def test_bad_flags_exit_2_naming_them(tmp_path, flags, match) -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT), *flags, "--out", str(tmp_path / "out")], cwd=REPO_ROOT,
                          env=_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert match in proc.stderr
    assert not (tmp_path / "out").exists()
