"""Differential checkpoint chains of DistributedModelParallel models, in spawned gloo processes.

A world-2 table-wise run with tiered tables saves a chain (a full step, then five deltas).
Restores of the chain ending after 1, 2 and 5 deltas must give exactly (tolerance 0) the
state and the later losses of the uninterrupted run, also into world size 1 on other tiers
and into row-wise and column-wise sharding. A world-1 run SIGKILLed at each stage of a full
and of a delta save, then restarted from its latest complete step, must end exactly like
the uninterrupted run, with the killed save's leftovers gone.

The runs are shared by the tests and batched to keep spawns few (each costs seconds):
every run that is not killed runs in one of two ``launch_many`` batches (world 2, world 1).
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Dict, List

import pytest
import torch

from tests.support import dmp_harness as harness
from tests.support.crash_helpers import fault_trace

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

TIERED = {"ssd_a": "ssd", "ssd_b": "ssd", "scm_c": "scm", "plain_d": None}
# World 1, other tiers: SSD -> DRAM, SCM -> SSD, plain FUSED stays FUSED.
SWAPPED = {"ssd_a": "dram", "ssd_b": "dram", "scm_c": "ssd", "plain_d": None}
# World 1, tables that change kind: the FUSED one (its deltas hold its changed rows) onto
# SCM, an SSD one into TorchRec's FUSED kernel.
KINDS = {"ssd_a": None, "ssd_b": "ssd", "scm_c": "dram", "plain_d": "scm"}
# A fraction this large never cuts a chain short: its length is full_every's alone.
FRACTION = 100.0

# The world-2 chain: saves every 2 steps of 12, a full step then 5 deltas.
STEPS, EVERY, FULL_EVERY = 12, 2, 6
DELTA_STEP = {1: 4, 2: 6, 5: 12}  # deltas in the chain -> its last step

# The world-1 kill runs: saves at 2 (full), 4 (delta), 6 (full, the second chain's), 8 (delta).
K_STEPS, K_EVERY, K_FULL_EVERY = 8, 2, 2
STAGES = ("checkpoint.write", "checkpoint.saved", "checkpoint.latest", "checkpoint.cleanup")
KILLED_SAVE = {"full": (3, 6), "delta": (2, 4)}  # kind -> (its save's count in the run, step)


def _name(step: int) -> str:
    return f"step_{step:08d}"


def _kill_listing(step: int) -> List[str]:
    """The kill runs' checkpoint directory after the save at ``step``: the newest chain only."""
    base = step - (step - K_EVERY) % (K_EVERY * K_FULL_EVERY)
    return ["latest"] + [_name(s) for s in range(base, step + 1, K_EVERY)]


def _kill_cases() -> List[tuple]:
    return [(kind, stage) for kind in KILLED_SAVE for stage in STAGES] + ASYNC_KILLS


# Saves in the background (async_save), killed while training goes on beside them: the
# restart (async too) must end as the uninterrupted run does.
ASYNC_KILLS = [("delta", "checkpoint.write", "async"), ("full", "checkpoint.latest", "async")]


def _case_id(kind: str, stage: str, mode: str = "") -> str:
    return f"{kind}_{stage.split('.')[1]}" + (f"_{mode}" if mode else "")


class Runs:
    """Every run of the module (made when the fixture is first used): out_dir of each by name,
    and what each killed run left (``after_kill``: ``latest`` and each step's files)."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.init = str(workdir / "init.pt")
        torch.save(harness.initial_weights(), self.init)
        self.chain = str(workdir / "chain")  # the world-2 reference's checkpoints
        self.out: Dict[str, str] = {}
        self.after_kill: Dict[str, dict] = {}
        self._make()

    def spec(self, name: str, **kwargs) -> harness.RunSpec:
        out = self.workdir / name
        out.mkdir()
        kwargs.setdefault("storage_dir", str(self.workdir / f"storage_{name}"))
        spec = harness.RunSpec(out_dir=str(out), **kwargs)
        self.out[name] = str(out)
        return spec

    def _batch(self, specs: List[harness.RunSpec]) -> None:
        codes = harness.launch_many(specs)
        unfinished = [s.out_dir for s in specs if not os.path.exists(os.path.join(s.out_dir, "losses.json"))]
        assert codes == [0] * specs[0].world_size and not unfinished, f"exit codes {codes}; unfinished: {unfinished}"

    def _make(self) -> None:
        chain = dict(diff_every=EVERY, full_every=FULL_EVERY, max_chain_fraction=FRACTION)
        ref = self.spec("ref", world_size=2, steps=STEPS, tiers=TIERED, init_file=self.init,
                        diff_dir=self.chain, snapshot_at=[DELTA_STEP[2]], **chain)
        codes = harness.launch(ref)
        assert codes == [0, 0], f"reference run: exit codes {codes}"

        def restore(name: str, deltas: int, world_size: int = 2, **kwargs) -> harness.RunSpec:
            path = os.path.join(self.chain, _name(DELTA_STEP[deltas]))
            kwargs.setdefault("tiers", TIERED)
            kwargs.setdefault("steps", DELTA_STEP[deltas])  # no training: the restored state is saved
            return self.spec(name, world_size=world_size, diff_dir=self.chain, restore_diff=True,
                             restore_path=path, **kwargs)

        self._batch([
            restore("deltas1_train", 1, steps=STEPS),
            restore("deltas2", 2),
            restore("deltas5", 5),
            restore("deltas5_row_wise", 5, sharding_type="row_wise"),
            # The FUSED table stays table-wise: its row-wise optimizer state cannot be loaded
            # column-wise (see test_restore_into_column_wise_is_exact).
            restore("deltas5_column_wise", 5, sharding_type="column_wise", table_sharding={"plain_d": "table_wise"}),
        ])
        world1 = [restore("deltas5_world1_swapped", 5, world_size=1, tiers=SWAPPED),
                  restore("deltas5_world1_kinds", 5, world_size=1, tiers=KINDS)]
        kill = dict(world_size=1, steps=K_STEPS, tiers=TIERED, init_file=self.init,
                    diff_every=K_EVERY, full_every=K_FULL_EVERY, max_chain_fraction=FRACTION)
        world1.append(self.spec("kill_ref", diff_dir=str(self.workdir / "kill_ref_chain"), **kill))
        for kind, stage, *mode in _kill_cases():
            case = _case_id(kind, stage, *mode)
            ckpt, storage = str(self.workdir / f"chain_{case}"), str(self.workdir / f"storage_{case}")
            trace = str(self.workdir / f"trace_{case}")
            killed = self.spec(f"killed_{case}", diff_dir=ckpt, storage_dir=storage,
                               fault=f"{stage}:{KILLED_SAVE[kind][0]}", fault_trace=trace,
                               diff_async=bool(mode), **kill)
            codes = harness.launch(killed)
            assert codes == [-signal.SIGKILL], f"killed run {case}: exit codes {codes}"
            self.after_kill[case] = _leftovers(ckpt)
            # The restart: same checkpoint and storage directories, restores the latest step.
            world1.append(self.spec(f"restart_{case}", diff_dir=ckpt, storage_dir=storage, restore_diff=True,
                                    diff_async=bool(mode), **kill))
        self._batch(world1)


def _leftovers(ckpt: str) -> dict:
    """A checkpoint directory as a killed run left it: ``latest`` and each step's files."""
    latest = Path(ckpt, "latest").read_text().strip() if os.path.exists(os.path.join(ckpt, "latest")) else None
    listing = {n: sorted(os.listdir(os.path.join(ckpt, n))) for n in os.listdir(ckpt) if n.startswith("step_")}
    return {"latest": latest, "listing": listing}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return Runs(tmp_path_factory.mktemp("chain_dmp"))


def _assert_equal_state(a: Dict[str, torch.Tensor], b: Dict[str, torch.Tensor], what: str) -> None:
    assert sorted(a) == sorted(b), what
    assert any(".momentum1" in k for k in a)  # optimizer state is compared too
    for key in a:
        assert a[key].dtype == b[key].dtype and a[key].shape == b[key].shape, f"{what}: {key}"
        if not torch.equal(a[key], b[key]):
            pytest.fail(f"{what}: {key} differs (max |diff| {(a[key].double() - b[key].double()).abs().max()})")


def _diff_saves(out: str) -> List[dict]:
    with open(os.path.join(out, "diff_saves.json")) as f:
        return json.load(f)


def _trainer(ckpt: str, step: int) -> dict:
    with open(os.path.join(ckpt, _name(step), "trainer.json")) as f:
        return json.load(f)


def test_reference_saves_a_full_step_then_five_deltas(runs: Runs) -> None:
    saves = _diff_saves(runs.out["ref"])
    # The FUSED table is whole in the full step's dense state, its changed rows in each delta.
    for step in (2, 4, 12):
        manifests = [json.loads(json.loads(Path(runs.chain, _name(step), f"tiered.rank{r}.json").read_text())["manifest"])
                     for r in range(2)]
        fused = [p for m in manifests for p in m["pieces"] if p["fused"]]
        assert [p["spec"]["table"] for p in fused] == ["plain_d"]
        assert fused[0]["complete"] == (step == 2) and bool(fused[0]["chunks"]) == (step != 2)
    assert [(s["step"], s["kind"]) for s in saves] == [(2, "full")] + [(s, "delta") for s in (4, 6, 8, 10, 12)]
    assert all(s["rows_written"] > 0 for s in saves)
    # A delta holds only the rows written since the previous save: fewer than the full step's.
    assert all(s["rows_written"] < saves[0]["rows_written"] for s in saves[1:])
    assert saves[-1]["listing"] == ["latest"] + [_name(s) for s in (2, 4, 6, 8, 10, 12)]
    assert _trainer(runs.chain, STEPS)["losses"] == harness.read_losses(runs.out["ref"])


def test_restore_after_one_delta_then_train_is_bit_identical(runs: Runs) -> None:
    ref, resumed = runs.out["ref"], runs.out["deltas1_train"]
    assert harness.read_losses(resumed) == harness.read_losses(ref)[DELTA_STEP[1]:]
    _assert_equal_state(harness.read_final(ref), harness.read_final(resumed), "restored after 1 delta, trained")


@pytest.mark.parametrize("deltas", [2, 5])
def test_restore_after_deltas_equals_the_state_saved_then(runs: Runs, deltas: int) -> None:
    snapshot = "final" if DELTA_STEP[deltas] == STEPS else f"snap_{DELTA_STEP[deltas]}"
    restored = runs.out[f"deltas{deltas}"]
    assert harness.read_losses(restored) == []
    _assert_equal_state(harness.read_final(runs.out["ref"], snapshot), harness.read_final(restored),
                        f"restored after {deltas} deltas")


@pytest.mark.parametrize("name", ["deltas5_world1_swapped", "deltas5_world1_kinds", "deltas5_row_wise"])
def test_restore_into_another_layout_is_exact(runs: Runs, name: str) -> None:
    _assert_equal_state(harness.read_final(runs.out["ref"]), harness.read_final(runs.out[name]), name)


def test_restore_into_column_wise_is_exact(runs: Runs) -> None:
    """In TorchRec's layout a column-wise table's row-wise optimizer state is one value per
    row *per column shard* (``[shards * rows]``, shard k at ``k * rows``): a restore from
    one shard per row gives every column shard that row's value, so each part must equal
    the reference's exactly. (A plain FUSED table cannot be restored column-wise at all:
    DCP does not reshape ``[rows]`` into ``[shards * rows]``, so the run keeps that one
    table-wise; the tiered tables, restored by the checkpointer's rows, are column-wise.)"""
    ref, restored = harness.read_final(runs.out["ref"]), harness.read_final(runs.out["deltas5_column_wise"])
    split = {}
    for key, value in ref.items():
        if ".momentum1" in key and restored[key].numel() != value.numel():
            shards = restored[key].numel() // value.numel()
            assert shards > 1 and restored[key].numel() == shards * value.numel(), key
            split[key] = restored[key].view(shards, -1)
            restored[key] = value.clone()  # compared part by part below
    assert len(split) == 2  # ssd_a and ssd_b are split in two; scm_c (12 columns) and plain_d are not
    for key, parts in split.items():
        for n, part in enumerate(parts):
            assert torch.equal(part, ref[key]), f"{key}: column shard {n} differs"
    _assert_equal_state(ref, restored, "column_wise")


def test_kill_reference_keeps_the_newest_chain_only(runs: Runs) -> None:
    saves = _diff_saves(runs.out["kill_ref"])
    assert [(s["step"], s["kind"]) for s in saves] == [(2, "full"), (4, "delta"), (6, "full"), (8, "delta")]
    assert [s["listing"] for s in saves] == [_kill_listing(s) for s in (2, 4, 6, 8)]


@pytest.mark.parametrize("case", _kill_cases(), ids=[_case_id(*c) for c in _kill_cases()])
def test_kill_inside_a_save_then_restart_is_bit_identical(runs: Runs, case: tuple) -> None:
    kind, stage = case[:2]
    case = _case_id(*case)
    count, step = KILLED_SAVE[kind]
    # The run died at that very point.
    assert fault_trace(str(runs.workdir / f"trace_{case}"))[-1] == (stage, str(count), "SIGKILL")

    # `latest` names a complete step: the killed one once switched, else the one before.
    after = runs.after_kill[case]
    switched = stage == "checkpoint.cleanup"
    expected = _name(step if switched else step - K_EVERY)
    assert after["latest"] == expected
    assert {"trainer.json", "tiered.rank0.json", ".metadata"} <= set(after["listing"][expected])
    if not switched:
        assert _name(step) in after["listing"]  # the killed save's leftovers, to be removed
    elif kind == "full":
        assert _name(2) in after["listing"]  # the previous chain, no longer needed

    ref, restart = runs.out["kill_ref"], runs.out[f"restart_{case}"]
    ref_saves, saves = _diff_saves(ref), _diff_saves(restart)
    start = int(expected[len("step_"):])
    # Its first save leaves what the uninterrupted run had after the same save.
    first = next(s for s in ref_saves if s["step"] == saves[0]["step"])
    assert saves[0]["step"] == start + K_EVERY and saves[0]["kind"] == first["kind"]
    assert saves[0]["listing"] == first["listing"] == _kill_listing(saves[0]["step"])
    ckpt = str(runs.workdir / f"chain_{case}")
    ref_ckpt = str(runs.workdir / "kill_ref_chain")
    assert sorted(os.listdir(ckpt)) == sorted(os.listdir(ref_ckpt))
    for name in os.listdir(ref_ckpt):
        if name.startswith("step_"):
            assert sorted(os.listdir(os.path.join(ckpt, name))) == sorted(os.listdir(os.path.join(ref_ckpt, name)))

    assert harness.read_losses(restart) == harness.read_losses(ref)[start:]
    assert _trainer(ckpt, K_STEPS)["losses"] == harness.read_losses(ref)
    _assert_equal_state(harness.read_final(ref), harness.read_final(restart), f"restart after {case}")
