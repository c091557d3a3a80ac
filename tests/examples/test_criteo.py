"""examples/dlrm on Criteo's file formats: raw TSV -> TorchRec's npy -> train.py -> AUC.

The raw files are generated here in Criteo's layout (label, 13 integer and 26 hex categorical
fields, tab-separated, some fields empty) with a planted signal: the label depends on the
values of three categorical features and on one integer feature. TorchRec's own script turns
them into npy files (``python -m torchrec.datasets.scripts.npy_preproc_criteo``), and the
example trains on them on tiered tables as a user would. The multi-hot files are in MLPerf
DLRM-DCNv2's layout, materialized here from the npy files (TorchRec's package ships neither
MLPerf's materialization script nor a reader).
"""

from __future__ import annotations

import json
import os
import runpy
import sys

import numpy as np
import pytest
import torch

from tests.support.crash_helpers import TRAIN, env, run, torchrun_env
from tests.support.paths import add_example_to_path
from tests.support.planner_nodes import PINNED_PROFILE

add_example_to_path()
from data import (  # noqa: E402
    MultiHotCriteoBatches,
    criteo_batches,
    criteo_files,
    criteo_multi_hot_sizes,
    criteo_splits,
    criteo_table_rows,
)

CAT, INT = 26, 13
SIGNAL_FEATURES = 3  # cat_0..cat_2 carry the planted effects
VOCAB = 300  # distinct hex values per categorical feature
# Two tables large enough to be tiered, the rest small; --target-qps makes the planner put
# one of the two on SCM and the other on SSD (the local profile's bandwidths).
ROWS = "50000,50000," + ",".join(["1000"] * (CAT - 2))
TIERED = ["--criteo-rows", ROWS, "--dram-budget", "4MiB", "--scm-budget", "8MiB", "--hardware", PINNED_PROFILE,
          "--input-time-per-sample", "0s"]
TWO_TIERS = ["--target-qps", "100000"]  # with 2 ranks: one table on SCM, one on SSD
MULTI_HOT_SIZES = [3, 2] + [1] * (CAT - 2)


def write_raw_criteo(path: str, lines: int, seed: int) -> None:
    """A file in Criteo's raw TSV layout whose labels follow a logistic model of cat_0..cat_2
    and int_0 (AUC of the true logit about 0.89, before the empty fields hide some of it); 10%
    of the integer fields and up to 40% of a categorical feature's fields are empty, as in
    Criteo."""
    rng = np.random.default_rng(seed)
    vocab = np.random.default_rng(0).integers(0, 2**32, size=(CAT, VOCAB))  # the same values in every file
    effect = 1.5 * np.random.default_rng(1).standard_normal((SIGNAL_FEATURES, VOCAB))
    slot = np.minimum(rng.zipf(1.3, size=(lines, CAT)) - 1, VOCAB - 1)  # skewed, as real ids are
    ints = np.floor(np.exp(rng.normal(1.5, 1.2, size=(lines, INT)))).astype(np.int64)
    logit = -1.0 + effect[np.arange(SIGNAL_FEATURES), slot[:, :SIGNAL_FEATURES]].sum(1)
    logit += 0.8 * (np.log(ints[:, 0] + 2.0) - 1.8)
    labels = (rng.random(lines) < 1.0 / (1.0 + np.exp(-logit))).astype(np.int64)
    int_text = np.where(rng.random((lines, INT)) < 0.1, "", ints.astype(str))
    hex_text = np.vectorize(lambda v: f"{v:08x}")(vocab)[np.arange(CAT), slot]
    cat_text = np.where(rng.random((lines, CAT)) < np.linspace(0.0, 0.4, CAT), "", hex_text)
    table = np.concatenate([labels.astype(str)[:, None], int_text, cat_text], axis=1)
    with open(path, "w") as f:
        f.writelines("\t".join(row) + "\n" for row in table)


def _extra_ids(ids: np.ndarray, count: int, rows: int) -> np.ndarray:
    """``count`` ids in [0, rows) per id, uniform and fixed per id (a multiplicative hash
    where MLPerf keeps a table of rows x count draws) [len(ids), count]."""
    j = np.arange(1, count + 1, dtype=np.uint64)
    mixed = (ids.astype(np.uint64)[:, None] + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15) * j
    return ((mixed >> np.uint64(17)) % np.uint64(rows)).astype(np.int64)


def materialize_multi_hot(npy_dir: str, out_dir: str, sizes, rows: int) -> None:
    """MLPerf DLRM-DCNv2's multi-hot files from TorchRec's npy ones, in the layout of its
    materialize_synthetic_multihot_dataset.py (uniform distribution): feature k of a sample
    holds its id hashed into ``rows`` followed by ``sizes[k] - 1`` ids fixed per id; one
    int32 array per feature, ``0`` to ``25``, in ``<name>_sparse_multi_hot.npz``, the dense
    and label files alongside."""
    os.makedirs(out_dir, exist_ok=True)
    for name in sorted(f[: -len("_sparse.npy")] for f in os.listdir(npy_dir) if f.endswith("_sparse.npy")):
        sparse = np.load(os.path.join(npy_dir, name + "_sparse.npy")) % rows
        arrays = {str(k): np.concatenate([sparse[:, k:k + 1], _extra_ids(sparse[:, k], sizes[k] - 1, rows)], 1)
                  .astype(np.int32) for k in range(CAT)}
        np.savez(os.path.join(out_dir, name + "_sparse_multi_hot.npz"), **arrays)
        for part in ("dense", "labels"):
            os.link(os.path.join(npy_dir, f"{name}_{part}.npy"), os.path.join(out_dir, f"{name}_{part}.npy"))


@pytest.fixture(scope="module")
def criteo_npy(tmp_path_factory) -> str:
    """Two Terabyte-style days (day_0: 24K samples, day_1: 8K), converted by TorchRec's script."""
    raw, npy = tmp_path_factory.mktemp("criteo_raw"), tmp_path_factory.mktemp("criteo_npy")
    write_raw_criteo(str(raw / "day_0"), 24_000, seed=10)
    write_raw_criteo(str(raw / "day_1"), 8_000, seed=11)
    # `python -m torchrec.datasets.scripts.npy_preproc_criteo --input_dir RAW --output_dir NPY`,
    # run in this process: a subprocess would spend most of its time importing torchrec again.
    argv = sys.argv
    sys.argv = ["npy_preproc_criteo", "--input_dir", str(raw), "--output_dir", str(npy)]
    try:
        runpy.run_module("torchrec.datasets.scripts.npy_preproc_criteo", run_name="__main__", alter_sys=True)
    finally:
        sys.argv = argv
    assert sorted(os.listdir(npy)) == [f"day_{d}_{p}.npy" for d in (0, 1) for p in ("dense", "labels", "sparse")]
    return str(npy)


def _metrics(out) -> dict:
    with open(os.path.join(out, "metrics.json")) as f:
        return json.load(f)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_raw_criteo_trains_on_tiered_tables_above_chance(criteo_npy, tmp_path) -> None:
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", TRAIN,
           "--criteo-dir", criteo_npy, "--steps", "20", "--batch-size", "512", "--eval-batches", "4",
           "--log-every", "10", *TIERED, *TWO_TIERS, "--storage-dir", str(tmp_path / "tiers"), "--out", str(out)]
    proc = run(cmd, torchrun_env(), timeout=150)
    assert proc.returncode == 0, proc.stderr[-4000:]
    m = _metrics(out)
    assert m["data"] == "criteo" and m["world_size"] == 2 and len(m["losses"]) == 20
    assert m["placement"]["t_cat_0"] in ("SCM", "SSD") and {"SCM", "SSD"} <= set(m["placement"].values())
    assert m["table_rows"]["t_cat_0"] == 50_000 and m["table_rows"]["t_cat_25"] == 1000
    assert m["auc"] > 0.6, m["auc"]  # held out: day_1's first half, never trained on


@pytest.mark.slow
def test_multi_hot_criteo_trains(criteo_npy, tmp_path) -> None:
    multi = str(tmp_path / "multi_hot")
    materialize_multi_hot(criteo_npy, multi, MULTI_HOT_SIZES, rows=50_000)
    out = tmp_path / "out"
    cmd = [sys.executable, TRAIN, "--criteo-dir", multi, "--criteo-multi-hot", "--steps", "12", "--batch-size",
           "256", "--eval-batches", "4", *TIERED, "--storage-dir", str(tmp_path / "tiers"), "--out", str(out)]
    proc = run(cmd, env(), timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    m = _metrics(out)
    assert m["data"] == "criteo" and len(m["losses"]) == 12
    # 3 and 2 ids per sample: one rank's traffic already puts one on SCM, the other on SSD.
    assert {m["placement"]["t_cat_0"], m["placement"]["t_cat_1"]} == {"SCM", "SSD"}
    assert m["auc"] > 0.6, m["auc"]


# ---------------------------------------------------------------------------- fast ----
def _npy_day(path_prefix: str, samples: int, seed: int, label=None) -> None:
    rng = np.random.default_rng(seed)
    np.save(path_prefix + "_dense.npy", rng.random((samples, INT), dtype=np.float32))
    np.save(path_prefix + "_sparse.npy", rng.integers(0, 2**31, (samples, CAT)))  # int32 in multi-hot files
    labels = rng.integers(0, 2, (samples, 1)) if label is None else np.full((samples, 1), label)
    np.save(path_prefix + "_labels.npy", labels.astype(np.int32))


def test_criteo_files_in_day_order_without_unlabelled(tmp_path) -> None:
    for day in (10, 2, 0):
        _npy_day(str(tmp_path / f"day_{day}"), 8, day)
    _npy_day(str(tmp_path / "test"), 8, 1, label=-1)  # Kaggle's test.txt: no labels
    files = criteo_files(str(tmp_path))
    assert [os.path.basename(p) for p in files] == ["day_0", "day_2", "day_10"]
    assert criteo_splits(files) == {"train": (files[:2], "train"), "eval": ([files[2]], "val")}
    assert criteo_splits(files[:1]) == {"train": (files[:1], "val"), "eval": (files[:1], "test")}
    with pytest.raises(ValueError, match="sparse_multi_hot.npz"):
        criteo_files(str(tmp_path), multi_hot=True)


def test_criteo_files_errors_say_what_to_do(tmp_path) -> None:
    (tmp_path / "day_0").write_text("0\t1\n")
    with pytest.raises(ValueError, match="raw Criteo files.*npy_preproc_criteo"):
        criteo_files(str(tmp_path))
    _npy_day(str(tmp_path / "test"), 4, 0, label=-1)
    with pytest.raises(ValueError, match="have no labels"):
        criteo_files(str(tmp_path))
    with pytest.raises(ValueError, match="is not a directory"):
        criteo_files(str(tmp_path / "nowhere"))


def test_criteo_table_rows() -> None:
    assert criteo_table_rows("1000") == [1000] * CAT
    assert criteo_table_rows(ROWS, max_rows=2000)[:3] == [2000, 2000, 1000]
    for bad in ("0", "1,2", "x", "-5"):
        with pytest.raises(ValueError, match="--criteo-rows"):
            criteo_table_rows(bad)


def test_criteo_flags() -> None:
    import train

    assert train.parse_args(["--criteo-dir", "d"]).data_dir == "d"
    assert train.parse_args(["--data-dir", "d"]).data_dir == "d"  # the old name still works
    assert train.parse_args([]).data_dir is None and not train.parse_args([]).criteo_multi_hot
    for bad in (["--criteo-multi-hot"], ["--criteo-rows", "1,2"]):
        with pytest.raises(SystemExit) as e:
            train.parse_args(bad)
        assert e.value.code == 2


@pytest.mark.parametrize("stage", ["train", "val", "test"])
def test_multi_hot_reader_matches_torchrecs_one_hot_pipe(tmp_path, stage) -> None:
    # With one id per feature and the identity lookup, the multi-hot files hold the one-hot
    # ids: MultiHotCriteoBatches must give TorchRec's batches, rank by rank, across files.
    for day, samples in ((0, 37), (1, 29)):
        _npy_day(str(tmp_path / f"day_{day}"), samples, day)
    materialize_multi_hot(str(tmp_path), str(tmp_path / "mh"), [1] * CAT, rows=2**31)
    rows = list(range(900, 900 + CAT))
    one = [str(tmp_path / "day_0"), str(tmp_path / "day_1")]
    multi = [str(tmp_path / "mh" / "day_0"), str(tmp_path / "mh" / "day_1")]
    for rank in range(2):
        want = list(criteo_batches(one, 8, rank, 2, rows, stage))
        got = criteo_batches(multi, 8, rank, 2, rows, stage, multi_hot=True)
        assert isinstance(got, MultiHotCriteoBatches) and len(got) == len(want) > 0
        for a, b in zip(got, want):
            assert torch.equal(a.dense_features, b.dense_features) and torch.equal(a.labels, b.labels)
            assert torch.equal(a.sparse_features.values(), b.sparse_features.values().long())
            assert torch.equal(a.sparse_features.lengths(), b.sparse_features.lengths().long())


def test_multi_hot_sizes_and_pooling(tmp_path) -> None:
    _npy_day(str(tmp_path / "day_0"), 16, 0)
    materialize_multi_hot(str(tmp_path), str(tmp_path / "mh"), MULTI_HOT_SIZES, rows=100)
    prefix = str(tmp_path / "mh" / "day_0")
    assert criteo_multi_hot_sizes(prefix) == MULTI_HOT_SIZES
    batch = next(iter(criteo_batches([prefix], 4, 0, 1, 50, multi_hot=True)))
    kjt = batch.sparse_features
    assert kjt.keys()[0] == "cat_0" and kjt["cat_0"].lengths().tolist() == [3] * 4
    assert kjt["cat_1"].lengths().tolist() == [2] * 4 and kjt["cat_25"].lengths().tolist() == [1] * 4
    assert int(kjt.values().max()) < 50  # hashed into the table's rows
    compressed = tmp_path / "bad_sparse_multi_hot.npz"
    np.savez_compressed(compressed, **{str(k): np.zeros((2, 1), np.int32) for k in range(CAT)})
    with pytest.raises(ValueError, match="compressed"):
        criteo_multi_hot_sizes(str(tmp_path / "bad"))
