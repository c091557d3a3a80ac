"""Differential checkpoints in this process (world size 1): what a delta holds, damaged and
broken chains, leftovers and retention, and the memory a full save takes."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path
from typing import Dict, List

import pytest
import torch
from torch.distributed._shard.sharded_tensor import ShardedTensor

from tests.support import dmp_harness as harness
from torchrec_mtrains.checkpoint import ChainError, DifferentialCheckpointer
from torchrec_mtrains.checkpoint.row_io import StepReader
from torchrec_mtrains.checkpoint.types import StepManifest

TIERS = {"ssd_a": "ssd", "ssd_b": "ssd", "scm_c": "scm", "plain_d": None}
SAVES = [2, 4, 6]  # a full step, then two deltas


def _flat(obj, prefix: str = "") -> Dict[str, torch.Tensor]:
    out: Dict[str, torch.Tensor] = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.update(_flat(v, f"{prefix}{k}."))
    elif isinstance(obj, ShardedTensor):
        out[prefix[:-1]] = torch.cat([s.tensor for s in obj.local_shards()]).clone()
    elif isinstance(obj, torch.Tensor):
        out[prefix[:-1]] = obj.detach().clone()
    return out


def full_state(dmp) -> Dict[str, torch.Tensor]:
    """Every weight and optimizer value, tiered tables read through their tiers."""
    return {**_flat(dmp.state_dict(), "model."), **_flat(dmp.fused_optimizer.state_dict(), "optim.")}


def assert_equal(a: Dict[str, torch.Tensor], b: Dict[str, torch.Tensor]) -> None:
    assert set(a) == set(b)
    for k in a:
        assert torch.equal(a[k], b[k]), k


def build(tmp: Path, name: str, tiers=TIERS):
    spec = harness.RunSpec(world_size=1, steps=0, out_dir=str(tmp), storage_dir=str(tmp / f"storage_{name}"),
                           tiers=tiers)
    dmp, opt = harness._build(spec, 0)
    harness._load_initial(dmp, str(tmp / "init.pt"))
    return dmp, opt


def train(dmp, opt, steps: range, on_step=None) -> List[set]:
    """Trains ``steps``; returns, per step, the (table, id) pairs its batch looked up."""
    from torchrec_mtrains.sharding import TieredTrainPipeline

    pipeline = TieredTrainPipeline(dmp, opt, torch.device("cpu"))
    batches = iter([harness.local_batch(s, 0, 1) for s in steps])
    touched = []
    for s in steps:
        pipeline.progress(batches)
        kjt = harness.local_batch(s, 0, 1).sparse_features.to_dict()
        touched.append({(f.rsplit("_f", 1)[0], int(i)) for f, jt in kjt.items() for i in jt.values()})
        if on_step is not None:
            on_step(s + 1)
    pipeline.detach()
    return touched


@pytest.fixture(scope="module")
def chain(process_group, tmp_path_factory):
    """A model trained 6 steps with saves after steps 2 (full), 4 and 6 (deltas)."""
    tmp = tmp_path_factory.mktemp("chain")
    torch.save(harness.initial_weights(), tmp / "init.pt")
    dmp, opt = build(tmp, "trained")
    # SSD tables copied like the others: this file checks what a step holds of each row
    # (test_checkpoint_links.py checks SSD tables saved by linking their files).
    ckpt = DifferentialCheckpointer(str(tmp / "ckpt"), full_every=10, max_chain_fraction=100.0, link_ssd_tables=False)
    records, states = {}, {}

    def save(step: int) -> None:
        if step in SAVES:
            records[step] = ckpt.save(step, dmp, None, {"note": f"at {step}"})
            states[step] = full_state(dmp)

    touched = train(dmp, opt, range(6), save)
    return tmp, dmp, records, states, touched


def test_a_delta_holds_exactly_the_rows_trained_since_the_previous_save(chain) -> None:
    tmp, _, records, _, touched = chain
    assert [records[s].kind for s in SAVES] == ["full", "delta", "delta"]
    for prev, step in zip(SAVES, SAVES[1:]):
        rows = set().union(*touched[prev:step])  # of tiered and FUSED tables alike
        assert records[step].rows_written == len(rows)
        manifest = _manifest(records[step].path)
        saved = {(p.spec.table, i) for p in manifest.pieces for i in _chunk_ids(records[step].path, p)}
        assert saved == rows
        assert {p.spec.table for p in manifest.pieces if p.fused} == {"plain_d"}
        # The FUSED table is out of the delta's dense state: its changed rows are the chunks.
        assert "model.ebc.embedding_bags.plain_d.weight" not in StepReader(records[step].path, None).metadata \
            .state_dict_metadata
    # The full step holds every tiered row (the initial weights were loaded into every row)
    # and the FUSED table whole in the dense state, as TorchRec saves it.
    assert records[2].rows_written == sum(r for t, (r, _, _) in harness.TABLES.items() if TIERS[t])
    full = StepReader(records[2].path, None).metadata.state_dict_metadata
    assert tuple(full["model.ebc.embedding_bags.plain_d.weight"].size) == harness.TABLES["plain_d"][:2]


def _manifest(path: str) -> StepManifest:
    with open(os.path.join(path, "tiered.rank0.json")) as f:
        return StepManifest.from_json(f.read(), path, None)


def _chunk_ids(path: str, piece) -> List[int]:
    reader = StepReader(path, None)
    ids: List[int] = []
    for c in piece.chunks:
        ids += list(range(c.row_lo, c.row_hi)) if c.dense else reader.read([f"{c.key}/ids"])[f"{c.key}/ids"].tolist()
    return ids


@pytest.mark.parametrize("upto", SAVES)
def test_restore_gives_the_state_of_each_step(chain, upto: int) -> None:
    tmp, _, records, states, _ = chain
    dmp, _ = build(tmp, f"restored_{upto}", tiers={"ssd_a": "dram", "ssd_b": "ssd", "scm_c": "ssd", "plain_d": None})
    trainer = DifferentialCheckpointer(str(tmp / "ckpt")).restore(dmp, None, path=records[upto].path)
    assert trainer == {"note": f"at {upto}", "step": upto}
    assert_equal(full_state(dmp), states[upto])


def test_restore_moves_tables_between_tiered_and_fused(chain) -> None:
    tmp, _, records, states, _ = chain
    # SSD -> FUSED (rows from the chain into TorchRec's tensors), FUSED -> SCM (rows from the
    # saved ShardedTensors into the tier), the others as saved.
    tiers = {"ssd_a": None, "ssd_b": "ssd", "scm_c": "scm", "plain_d": "scm"}
    dmp, _ = build(tmp, "kinds", tiers=tiers)
    DifferentialCheckpointer(str(tmp / "ckpt")).restore(dmp, None, path=records[6].path)
    assert_equal(full_state(dmp), states[6])


def _copy_chain(tmp: Path, name: str) -> Path:
    dst = tmp / name
    shutil.copytree(tmp / "ckpt", dst)
    return dst


def _refused(tmp: Path, ckpt: Path, name: str, match: str) -> ChainError:
    """A restore of ``ckpt`` into a fresh model fails with ``match`` and changes nothing."""
    dmp, _ = build(tmp, name)
    before = full_state(dmp)
    with pytest.raises(ChainError, match=match) as info:
        DifferentialCheckpointer(str(ckpt)).restore(dmp, None)
    assert_equal(full_state(dmp), before)
    return info.value


def test_a_flipped_byte_in_a_delta_is_named_and_nothing_is_restored(chain) -> None:
    tmp = chain[0]
    ckpt = _copy_chain(tmp, "flipped")
    step_dir = ckpt / "step_00000004"
    chunk = next(c for p in _manifest(str(step_dir)).pieces for c in p.chunks)
    where = StepReader(str(step_dir), 4).file_of(chunk.key)
    data = bytearray(Path(where).read_bytes())
    data[len(data) // 2] ^= 0x40
    Path(where).write_bytes(bytes(data))
    error = _refused(tmp, ckpt, "flipped", r"step 4")
    assert error.path == where and error.step == 4 and where in str(error)


@pytest.mark.parametrize("damage", ["manifest", "dense", "metadata", "trainer"])
def test_other_damage_is_named(chain, damage: str) -> None:
    tmp = chain[0]
    ckpt = _copy_chain(tmp, f"damaged_{damage}")
    step_dir = ckpt / "step_00000006"
    target = {
        "manifest": step_dir / "tiered.rank0.json",
        "dense": step_dir / next(f for f in _manifest(str(step_dir)).files if f != ".metadata"),
        "metadata": step_dir / ".metadata",
        "trainer": step_dir / "trainer.json",
    }[damage]
    data = bytearray(target.read_bytes())
    if damage == "trainer":  # not checksummed (the manifest holds the caller's state): cut short
        data = data[: len(data) // 2]
    else:
        data[len(data) // 3] ^= 0x01
    target.write_bytes(bytes(data))
    error = _refused(tmp, ckpt, f"damaged_{damage}", "step 6")
    assert error.step == 6 and str(target) in str(error)


@pytest.mark.parametrize("gone,match", [
    (4, r"delta checkpoint .*step_00000004 \(step 4\), which step 6 applies on, is missing"),
    (2, r"full checkpoint .*step_00000002 \(step 2\), which step 4 applies on, is missing"),
])
def test_a_missing_delta_or_full_step_is_named(chain, gone: int, match: str) -> None:
    tmp = chain[0]
    ckpt = _copy_chain(tmp, f"missing_{gone}")
    shutil.rmtree(ckpt / f"step_{gone:08d}")
    assert _refused(tmp, ckpt, f"missing_{gone}", match).step == gone


def test_leftovers_go_and_old_chains_go_once_a_new_one_is_complete(chain) -> None:
    tmp, dmp = chain[0], chain[1]
    ckpt = _copy_chain(tmp, "leftovers")
    (ckpt / "step_00000008").mkdir()  # a save killed before trainer.json
    (ckpt / "step_00000008" / "__0_0.distcp").write_bytes(b"partial")
    saver = DifferentialCheckpointer(str(ckpt), full_every=4, max_chain_fraction=100.0)
    saver.restore(dmp, None)
    assert sorted(os.listdir(ckpt)) == ["latest", "step_00000002", "step_00000004", "step_00000006"]
    assert saver.save(7, dmp, None, {}).kind == "delta"  # the restored chain goes on: 4 steps
    assert saver.save(8, dmp, None, {}).kind == "full"  # full_every reached
    assert sorted(os.listdir(ckpt)) == ["latest", "step_00000008"]


def _hwm_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM")


def _rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


@pytest.mark.slow
def test_a_full_save_of_a_table_larger_than_the_bound_stays_within_256_mb(process_group, tmp_path) -> None:
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.types import ShardingPlan

    from torchrec_mtrains import Tier
    from torchrec_mtrains.sharding import TieredEmbeddingBagCollectionSharder, TieredParams, tiered_sharding_plan

    rows, dim = 1_300_000, 64  # 338 MB of weights and row-wise state
    ebc = EmbeddingBagCollection(tables=[EmbeddingBagConfig(name="big", num_embeddings=rows, embedding_dim=dim,
                                                            feature_names=["f"])], device=torch.device("meta"))
    plan = tiered_sharding_plan(ebc, {"big": TieredParams(Tier.DRAM, cache_rows=1024)}, 1)
    sharder = TieredEmbeddingBagCollectionSharder(fused_params={"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD})
    dmp = DistributedModelParallel(ebc, plan=ShardingPlan({"": plan}), sharders=[sharder], device=torch.device("cpu"))
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS
    before = _rss_bytes()
    record = DifferentialCheckpointer(str(tmp_path / "ckpt")).save(1, dmp, None, {})
    assert record.kind == "full" and record.rows_written == rows  # a DRAM table: every row
    assert record.row_bytes == rows * (dim + 1) * 4 > 256 * 2**20
    assert _hwm_bytes() - before <= 256 * 2**20


class _HeldWriter:
    """Holds a background save before it reads its first row, until ``go`` is set, and
    counts the rows the copy-on-write of each snapshot kept meanwhile."""

    def __init__(self, monkeypatch) -> None:
        from torchrec_mtrains.checkpoint.row_io import RowChunkPlanner
        from torchrec_mtrains.kernels.row_snapshot import RowSnapshot

        self.go, self.started, self.stashed = threading.Event(), threading.Event(), []
        resolve, release = RowChunkPlanner.resolve_data, RowSnapshot.release

        def held_resolve(planner, item):
            if threading.current_thread() is threading.main_thread():  # a stopped save
                return resolve(planner, item)
            self.started.set()
            assert self.go.wait(60), "the test never let the save go on"
            return resolve(planner, item)

        def counted_release(snapshot):
            self.stashed.append(snapshot.rows_stashed)
            return release(snapshot)

        monkeypatch.setattr(RowChunkPlanner, "resolve_data", held_resolve)
        monkeypatch.setattr(RowSnapshot, "release", counted_release)


@pytest.mark.parametrize("kind", ["full", "delta"])
def test_an_async_save_is_the_model_as_of_its_step_while_training_goes_on(process_group, tmp_path, monkeypatch,
                                                                          kind: str) -> None:
    """Training runs eight steps (rows evicted to the tiers, FUSED rows updated) while the
    save of step 4 is held before reading any row; the step restores to exactly the state
    of step 4, as a stopped save of the same training does."""
    torch.save(harness.initial_weights(), tmp_path / "init.pt")
    states = {}

    def run(name: str, background: bool):
        dmp, opt = build(tmp_path, name)
        ckpt = DifferentialCheckpointer(str(tmp_path / f"ckpt_{name}"), full_every=1 if kind == "full" else 10,
                                        link_ssd_tables=False)
        held = _HeldWriter(monkeypatch) if background else None
        pending = []

        def on_step(step: int) -> None:
            if step == 2:
                ckpt.save(2, dmp, None, {})
            elif step == 4:
                states[name] = full_state(dmp)
                if background:
                    pending.append(ckpt.async_save(4, dmp, None, {"at": 4}))
                    assert held.started.wait(60)
                else:
                    ckpt.save(4, dmp, None, {"at": 4})
            elif step == 12 and background:
                assert not pending[0].done()  # held all along: training went on beside it
                held.go.set()

        train(dmp, opt, range(12), on_step)
        if background:
            record = pending[0].result(60)
            assert record.kind == kind and record.blocking_seconds < record.seconds
            assert sum(held.stashed) > 0  # training rewrote rows the save had not read yet
        monkeypatch.undo()
        return ckpt

    stopped, background = run("stopped", False), run("background", True)
    assert_equal(states["stopped"], states["background"])  # the same training
    for ckpt in (stopped, background):
        dmp, _ = build(tmp_path, f"restored_{id(ckpt)}")
        assert DifferentialCheckpointer(ckpt.directory).restore(dmp, None) == {"at": 4, "step": 4}
        assert_equal(full_state(dmp), states["stopped"])
