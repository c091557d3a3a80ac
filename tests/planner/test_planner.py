"""Planner: locality model against the real cache, MODEL.yaml checks, placement, sizing,
and a StorageAwarePlanner plan that DistributedModelParallel trains with."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional

import numpy as np
import pytest
import torch
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from torchrec.distributed import DistributedModelParallel
from torchrec.distributed.planner.types import ParameterConstraints

from tests.support.paths import MODEL_CONFIGS
from tests.support.planner_nodes import CPU_NODE, G
from torchrec_mtrains import Tier
from torchrec_mtrains.planner.model.locality import histogram_locality, zipf_locality
from torchrec_mtrains.planner.model.model_spec import parse_model_spec
from torchrec_mtrains.planner.model.placement import PlacementError, PlacementMemo, place
from torchrec_mtrains.planner.model.sizing import size_cluster
from torchrec_mtrains.planner.planner import StorageAwarePlanner
from torchrec_mtrains.planner.types import ComputeSpec, TieredTopology, TierSpec
from torchrec_mtrains.sharding import (
    TieredEmbeddingBagCollectionSharder,
    TieredParameterSharding,
)

GPU_NODE = TieredTopology(
    "test-gpu", "cuda", 8,
    {Tier.HBM: TierSpec(60 * G, 1.5e12, 1.5e12), Tier.DRAM: TierSpec(128 * G, 2e10, 2e10),
     Tier.SCM: TierSpec(512 * G, 5e9, 2e9, None, None, 256), Tier.SSD: TierSpec(2000 * G, 6e9, 4e9, 1e6, 2e5, 4096)},
    ComputeSpec(3e11, 1e-4, 5e-9, 1e-8), host_device_bytes_per_s=25e9,
)


def _zipf_trace(rows: int, lookups: int, alpha: float, steps: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    p = np.arange(1, rows + 1, dtype=np.float64) ** -alpha
    cdf = np.cumsum(p) / p.sum()
    for _ in range(steps):
        yield np.searchsorted(cdf, rng.random(lookups))


@pytest.mark.parametrize("alpha", [0.9, 1.05, 1.3])
def test_locality_model_predicts_the_real_lru_cache(alpha: float) -> None:
    # Caches larger than a step's distinct rows (the real cache grows an overflow pool
    # below that, which the model does not describe); measured once the cache is full.
    rows, lookups = 200_000, 2_000
    trace = iter(_zipf_trace(rows, lookups, alpha, 6000))
    curve = zipf_locality(rows, lookups, alpha)
    unique = np.mean([np.unique(next(trace)).size for _ in range(50)])
    assert abs(curve.unique_rows_per_step - unique) / unique < 0.02
    _has_ext()
    for frac in (0.01, 0.05, 0.1, 0.2):
        cap = int(rows * frac)
        cache = torch.classes.mtrains.SetAssociativeCache(cap, 32, "lru")
        hits = uniq = measured = 0
        for step in range(5000):
            u = torch.from_numpy(np.unique(next(trace))).long()
            _, load_rows, *_ = cache.plan(u, step, step, True)
            if measured or cache.occupied()[0].numel() >= 0.99 * cap:
                hits += u.numel() - load_rows.numel()
                uniq += u.numel()
                measured += 1
                if measured == 200:
                    break
        assert measured == 200 and cache.capacity() <= cap * 1.01  # full; few overflow slots
        assert abs(hits / uniq - curve.hit_rate(cap, "lru")) < 0.03, (frac, hits / uniq, curve.hit_rate(cap))


def _has_ext() -> bool:
    from torchrec_mtrains._ops import load_extension

    load_extension()
    return True


def test_histogram_locality_reads_lookup_shares_as_the_generator_does() -> None:
    # The reuse histogram is the share of LOOKUPS by reuse bin: one dlrm_datasets batch
    # (65,536 samples) of a 2M-row table cut into 64 steps touches ~38K rows (6.9 lookups
    # each), ~2.4K a step; the model's distinct rows per step match the generator's.
    from torchrec_mtrains.stats import (DLRM_DATASETS_LOOKUP_SHARES, SyntheticTable, analyze_table,
                                        generate_dlrm_batch, trace_from_dlrm_batches)

    b = generate_dlrm_batch([SyntheticTable(2_000_000, 4.0, reuse_histogram=DLRM_DATASETS_LOOKUP_SHARES)], 65_536)
    measured = analyze_table("t", trace_from_dlrm_batches([b], 1024, num_rows=[2_000_000]).tables["table_0"])
    curve = histogram_locality(2_000_000, 4096.0, DLRM_DATASETS_LOOKUP_SHARES, 64.0)
    assert curve.unique_rows_per_step == pytest.approx(measured.unique_rows_per_step, rel=0.05)
    assert curve.hit_rate(1000) < 0.3  # a 1,000-row cache holds a small part of the working set
    # A 16-value histogram (bins up to 16K+, the last two merged) reads the same way.
    legacy = DLRM_DATASETS_LOOKUP_SHARES[:15] + (sum(DLRM_DATASETS_LOOKUP_SHARES[15:]),)
    old_form = histogram_locality(2_000_000, 4096.0, legacy, 64.0)
    assert old_form.unique_rows_per_step == pytest.approx(curve.unique_rows_per_step, rel=0.01)
    with pytest.raises(ValueError, match="reuse_histogram must be 16 shares .* or 17"):
        histogram_locality(2_000_000, 4096.0, (1.0,) * 18, 64.0)


def test_zipf_locality_scales_to_billions_of_rows() -> None:
    curve = zipf_locality(10**10, 163_840, 1.05)
    assert 0 < curve.unique_rows_per_step <= 163_840
    assert 0 < curve.hit_rate(10**7) < curve.hit_rate(10**8) < 1
    assert curve.hit_rate(10**8, "lru") <= curve.hit_rate(10**8, "lfu") + 1e-12


MODEL = {
    "batch_size": 4096, "target_qps": 100_000, "dtype": "fp32", "optimizer": "rowwise_adagrad",
    "tables": [
        {"name": "big", "num_embeddings": 50_000_000, "embedding_dim": 64, "pooling_factor": 10, "zipf_alpha": 1.1},
        {"name": "mid", "count": 4, "num_embeddings": 2_000_000, "embedding_dim": 32, "pooling_factor": 4,
         "reuse_histogram": [0.069, 0.044, 0.068, 0.101, 0.122, 0.104, 0.073, 0.058, 0.052, 0.050, 0.049, 0.048,
                             0.048, 0.042, 0.031, 0.042]},
        {"name": "small", "num_embeddings": 10_000, "embedding_dim": 16, "pooling_factor": 1, "zipf_alpha": 0.5},
    ],
}


def test_model_spec_reads_tables_and_expands_counts() -> None:
    spec = parse_model_spec(MODEL)
    assert [t.name for t in spec.tables] == ["big", "mid_0", "mid_1", "mid_2", "mid_3", "small"]
    assert spec.tables[0].row_bytes == 64 * 4 + 4
    assert spec.embedding_bytes == sum(t.num_embeddings * t.row_bytes for t in spec.tables)


def test_model_spec_reads_17_value_reuse_histograms() -> None:
    import copy

    doc = copy.deepcopy(MODEL)
    seventeen = doc["tables"][1]["reuse_histogram"][:15] + [0.023, 0.019]
    doc["tables"][1]["reuse_histogram"] = seventeen
    mid = parse_model_spec(doc).tables[1]
    sixteen = parse_model_spec(MODEL).tables[1]
    assert mid.locality.unique_rows_per_step == pytest.approx(sixteen.locality.unique_rows_per_step, rel=0.02)
    doc["tables"][1]["reuse_histogram"] = seventeen + [0.0]
    with pytest.raises(ValueError, match=r"tables\[1\].reuse_histogram must be 16 shares"):
        parse_model_spec(doc)


@pytest.mark.parametrize(
    "change,match",
    [
        (lambda d: d.update(colour="red"), r"unknown keys \['colour'\]"),
        (lambda d: d.pop("batch_size"), "batch_size is missing"),
        (lambda d: d.update(batch_size=-5), "batch_size=-5"),
        (lambda d: d.update(dtype="int8"), "dtype"),
        (lambda d: d["tables"][0].update(num_embeddings=-1), r"tables\[0\].num_embeddings=-1"),
        (lambda d: d["tables"][0].update(embedding_dim=30), r"tables\[0\].embedding_dim=30 must be a multiple of 4"),
        (lambda d: d["tables"][0].update(rows=5), r"tables\[0\]: unknown keys \['rows'\]"),
        (lambda d: d["tables"][0].pop("zipf_alpha"), r"tables\[0\]: give exactly one of"),
        (lambda d: d["tables"][2].update(reuse_histogram=[1, 2]), r"tables\[1\].reuse_histogram"),
        (lambda d: d["tables"][0].pop("pooling_factor"), r"tables\[0\].pooling_factor is missing"),
        (lambda d: d["tables"].append(dict(d["tables"][2])), "duplicate names"),
        (lambda d: d.update(input_time_per_sample=5), "input_time_per_sample: 5 has no unit"),
        (lambda d: d.update(input_time_per_sample="-1us"), "input_time_per_sample: '-1us' is negative"),
    ],
)
def test_model_spec_errors_name_the_field(change, match) -> None:
    import copy

    doc = copy.deepcopy(MODEL)
    if "reuse_histogram=[1, 2]" in match or match.startswith(r"tables\[1\].reuse"):
        doc["tables"][1]["reuse_histogram"] = [1, 2]
    else:
        change(doc)
    with pytest.raises(ValueError, match=match):
        parse_model_spec(doc)


def test_placement_uses_slow_tiers_when_dram_is_short() -> None:
    spec = parse_model_spec(MODEL)
    p = place(spec, CPU_NODE, 2, budget_bytes={Tier.DRAM: 1 * G})
    tiers = {name: t.tier for name, t in p.tables.items()}
    assert tiers["big"] in (Tier.SSD, Tier.SCM) and tiers["small"] is Tier.DRAM
    assert p.used_bytes[Tier.DRAM] <= 1 * G
    for name, t in p.tables.items():
        assert (t.cache_rows > 0) == (t.tier is not Tier.DRAM)
    whole = place(spec, CPU_NODE, 2, budget_bytes={Tier.DRAM: 100 * G})
    assert whole.predicted_qps >= p.predicted_qps


def test_planner_counts_the_dense_slot_map_in_dram_where_the_rule_keeps_it() -> None:
    """The kernel keeps a dense row-to-slot map (4 bytes a table row) where it is at most an
    eighth of its cache's row bytes (torchrec_mtrains/slot_map.py): the plan's DRAM holds
    it beside the cache's rows there, and only the rows where the cache is too small for it."""
    from torchrec_mtrains.planner.model.placement import tier_bytes
    from torchrec_mtrains.slot_map import dense_map_pays

    ebc = EmbeddingBagCollection(tables=[EmbeddingBagConfig(
        name="big", num_embeddings=2_000_000, embedding_dim=128, feature_names=["f"])], device=torch.device("meta"))
    planner = StorageAwarePlanner(CPU_NODE, batch_size=4096, world_size=1,
                                  locality={"big": {"pooling_factor": 20, "zipf_alpha": 1.05}},
                                  budget_bytes={Tier.DRAM: 300 << 20})
    p = planner.place(ebc)
    table, placed = planner.model_spec(ebc).tables[0], p.tables["big"]
    assert placed.tier in (Tier.SCM, Tier.SSD) and placed.cache_rows > 0
    map_bytes = 4.0 * table.num_embeddings
    assert map_bytes <= placed.cache_rows * table.row_bytes / 8  # the scenario: the rule keeps the map
    assert p.used_bytes[Tier.DRAM] == pytest.approx(placed.cache_rows * table.row_bytes + map_bytes)
    small = 0.01 * table.num_embeddings  # 10 MiB of rows: the map's 7.6 MiB is more than an eighth
    assert not dense_map_pays(table.num_embeddings, small, table.row_bytes)
    assert tier_bytes(table, Tier.SSD, small, 0.0, Tier.DRAM) == {Tier.SSD: table.bytes_on(Tier.SSD),
                                                                   Tier.DRAM: small * table.row_bytes}
    assert tier_bytes(table, Tier.DRAM, 0.0, 0.0, Tier.DRAM) == {Tier.DRAM: table.bytes}  # whole: no cache


def test_ssd_writes_cost_their_bytes_and_reads_a_block_each() -> None:
    """The block store appends evicted rows to log segments: a miss costs one random block
    read (IOPS) but only its row's bytes written; SCM rows cost access units both ways."""
    from torchrec_mtrains.planner.model.estimator import table_cost

    spec = parse_model_spec({**MODEL, "tables": [MODEL["tables"][0]]})
    table = spec.tables[0]
    cache = 0.01 * table.num_embeddings
    ssd, scm = (table_cost(table, tier, cache, CPU_NODE, spec.batch_size) for tier in (Tier.SSD, Tier.SCM))
    misses = ssd.tier_bytes_per_step / (2 * table.row_bytes)
    dev = CPU_NODE.tiers[Tier.SSD]
    reads = max(misses * 4096 / dev.read_bytes_per_s, misses / dev.read_iops)
    assert ssd.io_s[Tier.SSD] == pytest.approx(reads + misses * table.row_bytes / dev.write_bytes_per_s)
    dev = CPU_NODE.tiers[Tier.SCM]
    units = -(-table.row_bytes // 64) * 64
    assert scm.io_s[Tier.SCM] == pytest.approx(misses * units / dev.read_bytes_per_s + misses * units / dev.write_bytes_per_s)


def _meta_ebc(tables) -> EmbeddingBagCollection:
    return EmbeddingBagCollection(device=torch.device("meta"), tables=[
        EmbeddingBagConfig(name=name, num_embeddings=rows, embedding_dim=dim, feature_names=[f"f_{name}"])
        for name, rows, dim in tables])


def _one_heavy_table():
    """A 10M-row Zipf table that one rank's DRAM share cannot hold, and four small ones:
    (the collection, its locality, a DRAM budget)."""
    ebc = _meta_ebc([("zipf", 10_000_000, 32)] + [(f"hot{i}", 100_000, 32) for i in range(4)])
    locality = {"zipf": {"pooling_factor": 4, "zipf_alpha": 1.1},
                **{f"hot{i}": {"pooling_factor": 1, "zipf_alpha": 0.8} for i in range(4)}}
    zipf_bytes = 10_000_000 * (32 + 1) * 4
    return ebc, locality, {Tier.DRAM: 1.5 * zipf_bytes}  # pooled it holds the table whole; a rank's share does not


def _slowest_rank_step(group_s: float, tmp_path: Path, sharding: Optional[str] = None):
    """(planner, its slowest rank's predicted step) for ``_one_heavy_table`` on 2 ranks of
    CPU_NODE with a row-wise group costing ``group_s``; ``sharding`` forces the heavy
    table's sharding type."""
    ebc, locality, budget = _one_heavy_table()
    node = dataclasses.replace(CPU_NODE, compute=dataclasses.replace(CPU_NODE.compute, row_wise_group_s=group_s))
    constraints = {} if sharding is None else {"zipf": ParameterConstraints(sharding_types=[sharding])}
    planner = StorageAwarePlanner(node, batch_size=4096, world_size=2, locality=locality, budget_bytes=budget,
                                  storage_dir=str(tmp_path), constraints=constraints)
    planner.plan(ebc, [TieredEmbeddingBagCollectionSharder()])
    return planner, max(planner.last_rank_step_s)


def test_planner_shards_the_slowest_ranks_table_row_wise_when_predicted_faster(tmp_path: Path) -> None:
    """Table-wise, the cached Zipf table's tier I/O makes its rank the slowest; split by rows
    it is spread over both. With a row-wise group that costs little, the planner takes the
    row-wise plan: its slowest rank is faster, and the two ranks' steps even out."""
    table_wise = _slowest_rank_step(1e-5, tmp_path, "table_wise")[1]
    planner, chosen = _slowest_rank_step(1e-5, tmp_path)
    assert planner.last_assignment["zipf"].sharding_type == "row_wise"
    assert planner.last_assignment["zipf"].ranks == (0, 1)
    assert chosen < table_wise
    assert max(planner.last_rank_step_s) <= 1.1 * min(planner.last_rank_step_s)  # balanced
    assert planner.last_placement.predicted_step_s == pytest.approx(chosen)


def test_planner_keeps_table_wise_when_row_wise_is_not_faster(tmp_path: Path) -> None:
    """The same tables with a row-wise group whose collectives cost more than the split
    spreads: the planner keeps every table table-wise, and the row-wise plan it turned down
    is indeed predicted slower."""
    row_wise = _slowest_rank_step(2e-3, tmp_path, "row_wise")[1]
    planner, chosen = _slowest_rank_step(2e-3, tmp_path)
    assert {a.sharding_type for a in planner.last_assignment.values()} == {"table_wise"}
    assert chosen <= row_wise


def test_cpu_placement_keeps_tables_table_wise(tmp_path: Path) -> None:
    """On a CPU node a table is made whole in DRAM only if one rank's share holds it: one
    larger would be split by rows, a sharding group of its own whose collectives cost the
    example DLRM more than caching it does; it is cached on a backing tier instead."""
    ebc, locality, budget = _one_heavy_table()
    # A row-wise group's collectives as the framework probe measured them on the 2-core VM:
    # they outweigh what splitting the table would spread (see the balancing tests below).
    node = dataclasses.replace(CPU_NODE, compute=dataclasses.replace(CPU_NODE.compute, row_wise_group_s=1.1e-3))
    planner = StorageAwarePlanner(node, batch_size=4096, world_size=2, locality=locality, budget_bytes=budget,
                                  storage_dir=str(tmp_path))
    plan = planner.plan(ebc, [TieredEmbeddingBagCollectionSharder()])
    zipf = planner.last_placement.tables["zipf"]
    assert zipf.tier in (Tier.SCM, Tier.SSD) and zipf.cache_rows > 0
    assert {a.sharding_type for a in planner.last_assignment.values()} == {"table_wise"}
    assert {ps.sharding_type for ps in plan.plan[""].values()} == {"table_wise"}
    # One rank alone holds it: whole in DRAM, as before.
    alone = StorageAwarePlanner(CPU_NODE, batch_size=4096, world_size=1, locality=locality, budget_bytes=budget,
                                storage_dir=str(tmp_path))
    alone.plan(ebc, [TieredEmbeddingBagCollectionSharder()])
    assert alone.last_placement.tables["zipf"].tier is Tier.DRAM and alone.last_placement.tables["zipf"].cache_rows == 0


def test_plan_predicts_its_slowest_rank(tmp_path: Path) -> None:
    """``plan`` predicts the job at the pace of its slowest rank (its tables' cost, the
    tiered kernel's fixed cost once on a rank with tiered tables, the dense part), not at
    the even spread ``place`` assumes; the input pipeline's cost per sample lengthens it."""
    ebc = _meta_ebc([("zipf", 1_000_000, 32), ("hot", 100_000, 32), ("tiny", 1_000, 32)])
    locality = {"zipf": {"pooling_factor": 40, "zipf_alpha": 1.1}, "hot": {"pooling_factor": 1, "zipf_alpha": 0.8},
                "tiny": {"pooling_factor": 1, "zipf_alpha": 0.8}}
    budget = {Tier.DRAM: 200e6}  # a rank's share cannot hold "zipf" whole: cached, table-wise, on one rank
    # Row-wise collectives that cost more than splitting "zipf" would spread: it stays on one rank.
    node = dataclasses.replace(CPU_NODE, compute=dataclasses.replace(CPU_NODE.compute, row_wise_group_s=2e-3))

    def planned(input_s: float) -> StorageAwarePlanner:
        planner = StorageAwarePlanner(node, batch_size=4096, world_size=2, locality=locality, budget_bytes=budget,
                                      storage_dir=str(tmp_path), input_s_per_sample=input_s)
        planner.plan(ebc, [TieredEmbeddingBagCollectionSharder()])
        return planner

    planner = planned(0.0)
    steps = planner.last_rank_step_s
    assert len(steps) == 2 and planner.last_placement.predicted_step_s == pytest.approx(max(steps))
    assert planner.last_placement.predicted_qps == pytest.approx(4096 / max(steps))
    even = planner.place(ebc)
    assert even.predicted_step_s < max(steps)  # one rank holds the big table: not an even split
    slower = planned(1e-5)
    assert slower.last_placement.predicted_step_s == pytest.approx(max(slower.last_rank_step_s))
    assert slower.last_placement.predicted_step_s >= max(steps) + 2048 * 1e-5 * 0.999
    with pytest.raises(ValueError, match="input_s_per_sample=-1"):
        StorageAwarePlanner(CPU_NODE, batch_size=4096, world_size=2, input_s_per_sample=-1)


def test_plan_goes_through_torchrec_planner_interfaces() -> None:
    """The plan is TorchRec's enumerate -> estimate -> propose -> partition: options carry
    TieredStorage (with SCM) and Perf per shard; a table no rank holds is proposed again
    row-wise after the partition fails; the partitioner respects every tier's capacity."""
    from torchrec.distributed.planner.types import Enumerator, Partitioner, PlannerError, Proposer, ShardEstimator

    from torchrec_mtrains.planner.adapters.enumerator import TieredEnumerator
    from torchrec_mtrains.planner.adapters.partitioner import TieredPartitioner
    from torchrec_mtrains.planner.adapters.proposer import TieredProposer
    from torchrec_mtrains.planner.adapters.shard_estimators import TieredPerfEstimator, TieredStorageEstimator
    from torchrec_mtrains.planner.adapters.tiered_storage import TieredStorage, torchrec_topology

    assert issubclass(TieredEnumerator, Enumerator) and issubclass(TieredProposer, Proposer)
    assert issubclass(TieredPartitioner, Partitioner) and issubclass(TieredStorageEstimator, ShardEstimator)
    ebc = _meta_ebc([("big", 4_000_000, 64), ("scm", 2_000_000, 32), ("small", 10_000, 16)])
    spec = parse_model_spec({"batch_size": 1024, "target_qps": 1, "tables": [
        {"name": "big", "num_embeddings": 4_000_000, "embedding_dim": 64, "pooling_factor": 2, "zipf_alpha": 1.1},
        {"name": "scm", "num_embeddings": 2_000_000, "embedding_dim": 32, "pooling_factor": 2, "zipf_alpha": 1.1},
        {"name": "small", "num_embeddings": 10_000, "embedding_dim": 16, "pooling_factor": 1, "zipf_alpha": 0.5},
    ]})
    p = place(spec, CPU_NODE, 2, budget_bytes={Tier.DRAM: 0.2 * G})
    assert p.tables["big"].tier is not Tier.DRAM
    # Each rank's room on big's tier: the other tables there and 60% of big, so big fits
    # only split over both ranks.
    tier = p.tables["big"].tier
    big = next(t for t in spec.tables if t.name == "big")
    capacity = dict(p.capacity_bytes)
    capacity[tier] = 2 * (0.6 * big.bytes + p.used_bytes[tier] - big.bytes)
    topology = torchrec_topology(CPU_NODE, 2, capacity)
    assert isinstance(topology.devices[0].storage, TieredStorage)
    enumerator = TieredEnumerator(topology, 1024, estimator=[TieredStorageEstimator(topology), TieredPerfEstimator(topology)],
                                  model=spec, placement=p, compute_tier=Tier.DRAM)
    options = enumerator.enumerate(ebc, [TieredEmbeddingBagCollectionSharder()])
    assert sorted({(o.name, o.sharding_type) for o in options}) == sorted(
        (n, s) for n in ("big", "scm", "small") for s in ("table_wise", "row_wise"))
    for o in options:
        whole = sum((s.storage for s in o.shards), TieredStorage(0, 0))
        assert whole.on(o.placement.tier) == pytest.approx(o.table.bytes, rel=1e-6)
        assert sum(s.perf.total for s in o.shards) == pytest.approx(
            o.cost.compute_s + max(o.cost.io_s.values(), default=0.0), rel=1e-6)
    proposer, partitioner = TieredProposer(), TieredPartitioner(0.001, Tier.DRAM)
    proposer.load(options, enumerator)
    first = proposer.propose()
    assert {o.sharding_type for o in first} == {"table_wise"}
    with pytest.raises(PlannerError, match=r"big \(whole on one rank\)"):
        partitioner.partition(first, topology)
    proposer.feedback(partitionable=False, plan=first)
    for _ in range(3):  # big row-wise leaves a rank too little DRAM for scm's cache: scm next
        proposal = proposer.propose()
        assert {o.name: o.sharding_type for o in proposal}["big"] == "row_wise"
        try:
            done = partitioner.partition(proposal, topology)
            break
        except PlannerError:
            proposer.feedback(partitionable=False, plan=proposal)
    else:
        pytest.fail("no proposal partitioned")
    used = [TieredStorage(0, 0) for _ in range(2)]
    for o in done:
        for s in o.shards:
            used[s.rank] = used[s.rank] + s.storage
    for r in range(2):
        assert used[r].fits_in(topology.devices[r].storage)
    proposer.feedback(partitionable=True, plan=done)
    assert proposer.propose() is None


@pytest.mark.parametrize("dram_budget", [1.0, 1.2, 1.6])  # GB: the light cache fits a rank whole, not beside half the heavy one
def test_a_split_that_leaves_a_table_without_room_splits_it_too(dram_budget: float) -> None:
    """Table-wise, the table with the most tier I/O makes its rank the slowest. Split by rows,
    its cache takes half its room on every rank (placed first, even when the other table's
    cache is larger), and the other cached table no longer fits whole on either: the
    proposer then splits that one too, rather than giving up on the split, and keeps the
    plan whose slowest rank is fastest (both split, the ranks even)."""
    from torchrec.distributed.planner.types import PlannerError

    from torchrec_mtrains.planner.adapters.enumerator import TieredEnumerator
    from torchrec_mtrains.planner.adapters.partitioner import TieredPartitioner
    from torchrec_mtrains.planner.adapters.proposer import TieredProposer
    from torchrec_mtrains.planner.adapters.shard_estimators import TieredPerfEstimator, TieredStorageEstimator
    from torchrec_mtrains.planner.adapters.tiered_storage import torchrec_topology

    tables = [("heavy", 4_000_000, 64, 8), ("light", 4_000_000, 192, 1), ("small", 10_000, 16, 1)]
    ebc = _meta_ebc([(n, r, d) for n, r, d, _ in tables])
    spec = parse_model_spec({"batch_size": 1024, "target_qps": 1, "tables": [
        {"name": n, "num_embeddings": r, "embedding_dim": d, "pooling_factor": pf, "zipf_alpha": 1.1}
        for n, r, d, pf in tables]})
    p = place(spec, CPU_NODE, 2, budget_bytes={Tier.DRAM: dram_budget * G})
    capacity = dict(p.capacity_bytes)
    topology = torchrec_topology(CPU_NODE, 2, capacity)
    enumerator = TieredEnumerator(topology, 1024, estimator=[TieredStorageEstimator(topology),
                                                             TieredPerfEstimator(topology)],
                                  model=spec, placement=p, compute_tier=Tier.DRAM)
    options = enumerator.enumerate(ebc, [TieredEmbeddingBagCollectionSharder()])
    cache = {o.name: o.tier_bytes[Tier.DRAM] for o in options if o.sharding_type == "table_wise"}
    # Each rank holds either cache whole, but not the light one beside half the heavy one;
    # half of each fits.
    room = 1.05 * max(cache["heavy"], cache["light"]) + cache["small"] + 1e6
    assert cache["light"] + cache["small"] <= room < cache["light"] + cache["heavy"] / 2
    assert (cache["heavy"] + cache["light"]) / 2 + cache["small"] <= room
    capacity[Tier.DRAM] = 2 * room
    topology = torchrec_topology(CPU_NODE, 2, capacity)
    proposer, partitioner = TieredProposer(), TieredPartitioner(0.001, Tier.DRAM)
    proposer.load(options, enumerator)
    tried = []
    while (proposal := proposer.propose()) is not None:
        shardings = {o.name: o.sharding_type for o in proposal}
        try:
            done = partitioner.partition(proposal, topology)
        except PlannerError:
            tried.append((shardings, None))
            proposer.feedback(partitionable=False, plan=proposal)
            continue
        tried.append((shardings, max(partitioner.rank_step_s)))
        proposer.feedback(partitionable=True, plan=done, perf_rating=max(partitioner.rank_step_s))
    table_wise = dict(heavy="table_wise", light="table_wise", small="table_wise")
    assert tried[0][0] == table_wise and tried[0][1] is not None
    assert tried[1] == (dict(table_wise, heavy="row_wise"), None)  # the light table left without room
    best = {o.name: o.sharding_type for o in proposer.best()}
    assert best == dict(table_wise, heavy="row_wise", light="row_wise")
    assert proposer.best_rating() < 0.9 * tried[0][1]
    partitioner.partition(proposer.best(), topology)
    assert max(partitioner.rank_step_s) <= 1.05 * min(partitioner.rank_step_s)


def test_placement_reports_what_does_not_fit() -> None:
    spec = parse_model_spec(MODEL)
    with pytest.raises(PlacementError, match=r"on 1 ranks of test-cpu: the tables do not fit \(no tier holds big"):
        place(spec, CPU_NODE, 1, tiers=[Tier.DRAM], budget_bytes={Tier.DRAM: 1 * G})


def test_a_row_cache_dram_cannot_hold_is_named_with_its_size_and_the_budget() -> None:
    # SSD and SCM have room for the table's rows, but its smallest row cache (two steps'
    # distinct rows at 4096 x 20 lookups) does not fit 8 MiB of DRAM, nor does the table whole.
    ebc = EmbeddingBagCollection(tables=[EmbeddingBagConfig(
        name="big", num_embeddings=5_000_000, embedding_dim=64, feature_names=["f"])], device=torch.device("meta"))
    planner = StorageAwarePlanner(CPU_NODE, batch_size=4096, world_size=1,
                                  locality={"big": {"pooling_factor": 20, "zipf_alpha": 1.05}},
                                  budget_bytes={Tier.DRAM: 8 << 20})
    with pytest.raises(PlacementError) as got:
        planner.place(ebc)
    message = str(got.value)
    spec = planner.model_spec(ebc)
    table = spec.tables[0]
    cache_rows = PlacementMemo(spec, CPU_NODE).sizes["big"][0]
    cache_mib = cache_rows * table.row_bytes / 2**20
    assert cache_mib > 8  # the scenario: the cache alone is over the budget
    assert "table big (5,000,000 rows" in message
    assert f"row cache of at least {cache_rows:,.0f} rows" in message and f"{cache_mib:,.1f} MiB of DRAM" in message
    assert "the job's DRAM budget is 8.0 MiB (8.0 MiB left)" in message
    assert "capacity left DRAM 8.0 MiB, " in message and "-" not in message.split("capacity left")[1]


def test_tables_kept_whole_over_the_budget_say_by_how_much() -> None:
    # Small tables stay whole in DRAM (a cache would not repay its step overhead): 3 x 3.1 MiB
    # against a 4 MiB budget. No capacity left is negative.
    ebc = EmbeddingBagCollection(tables=[EmbeddingBagConfig(
        name=f"t{i}", num_embeddings=12_500, embedding_dim=64, feature_names=[f"f{i}"]) for i in range(3)],
        device=torch.device("meta"))
    planner = StorageAwarePlanner(CPU_NODE, batch_size=512, world_size=1, budget_bytes={Tier.DRAM: 4 << 20})
    with pytest.raises(PlacementError) as got:
        planner.place(ebc)
    placed = 3 * planner.model_spec(ebc).tables[0].bytes / 2**20
    assert f"the tables placed take {placed:,.1f} MiB of DRAM, and the job's DRAM budget is 4.0 MiB" in str(got.value)
    assert "capacity left DRAM 0.0 MiB" in str(got.value)


def test_sizing_needs_fewer_nodes_with_scm_and_ssd() -> None:
    doc = {"batch_size": 65536, "target_qps": 200_000, "tables": [
        {"name": "huge", "count": 100, "num_embeddings": 200_000_000, "embedding_dim": 128, "pooling_factor": 10,
         "zipf_alpha": 1.15},
        {"name": "hot", "count": 200, "num_embeddings": 500_000, "embedding_dim": 64, "pooling_factor": 20,
         "zipf_alpha": 0.8},
    ]}
    spec = parse_model_spec(doc)
    tiered, p = size_cluster(spec, GPU_NODE)
    baseline, q = size_cluster(spec, GPU_NODE, tiers=[Tier.HBM, Tier.DRAM])
    assert tiered < baseline
    assert p.predicted_qps >= 200_000 and q.predicted_qps >= 200_000
    with pytest.raises(PlacementError, match="does not fit even 3 nodes"):
        size_cluster(spec, GPU_NODE, tiers=[Tier.HBM, Tier.DRAM], max_nodes=3)


def test_placement_falls_back_when_the_greedy_strands_tables_on_a_slow_tier() -> None:
    """prod_b (benchmarks/configs/models) on 3 gpu-scm-nodes: starting every table on SSD,
    relieving only busy tiers leaves tables there that no affordable cache can feed;
    place() finds the plan that exists (most tables on PMem and in host DRAM) and it keeps
    every capacity and every tier's device-time budget."""
    from torchrec_mtrains.planner.model.estimator import table_cost
    from torchrec_mtrains.planner.model.model_spec import load_model_spec
    from torchrec_mtrains.planner.model.placement import MAX_TIER_UTILIZATION, PlacementMemo
    from torchrec_mtrains.planner.model.placement_search import STRATEGIES, Placer
    from torchrec_mtrains.planner.model.placement_state import Limits
    from torchrec_mtrains.planner.hardware.topology import load_topology

    spec = load_model_spec(str(MODEL_CONFIGS / "prod_b.yaml"))
    topo = load_topology("gpu-scm-node")
    ranks = 3 * topo.ranks_per_node
    memo = PlacementMemo(spec, topo)
    assert STRATEGIES[0] == (False, 1.0)  # every table starts on SSD; step 2 steers by the real budget
    with pytest.raises(PlacementError, match="cannot feed"):
        Placer(memo, ranks, Limits.of(memo, ranks), STRATEGIES[0]).run()
    p = place(spec, topo, ranks)
    assert p.predicted_qps >= spec.target_qps
    for tier, used in p.used_bytes.items():
        assert used <= p.capacity_bytes[tier] * (1 + 1e-9), tier
    io = {}
    for table in spec.tables:
        t = p.tables[table.name]
        cost = table_cost(table, t.tier, t.cache_rows, topo, spec.batch_size, "lru", t.extra.get("l2_cache_rows", 0.0))
        for tier, seconds in cost.io_s.items():
            io[tier] = io.get(tier, 0.0) + seconds
    budget = spec.batch_size / spec.target_qps * ranks * MAX_TIER_UTILIZATION
    assert all(seconds <= budget * (1 + 1e-9) for seconds in io.values()), io



def test_planner_plan_trains_in_dmp(process_group, tmp_path: Path) -> None:
    configs = [EmbeddingBagConfig(name=f"t{i}", num_embeddings=n, embedding_dim=8, feature_names=[f"f{i}"])
               for i, n in enumerate((200_000, 50_000, 500))]
    ebc = EmbeddingBagCollection(tables=configs, device=torch.device("cpu"))
    planner = StorageAwarePlanner(CPU_NODE, batch_size=64, world_size=1, target_qps=1000,
                                  locality={"t0": {"pooling_factor": 2, "zipf_alpha": 1.2}},
                                  budget_bytes={Tier.DRAM: 3_000_000}, storage_dir=str(tmp_path))
    plan = planner.collective_plan(ebc, [TieredEmbeddingBagCollectionSharder()])
    entries = plan.plan[""]
    assert isinstance(entries["t0"], TieredParameterSharding) and entries["t0"].tiered.tier in (Tier.SSD, Tier.SCM)
    assert entries["t2"].compute_kernel == "fused"
    model = DistributedModelParallel(ebc, plan=plan, sharders=[TieredEmbeddingBagCollectionSharder()],
                                     device=torch.device("cpu"))
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=["f0", "f1", "f2"], values=torch.randint(0, 500, (24,)),
                                              lengths=torch.full((12,), 2))
    out = model(kjt).values()
    assert out.shape == (4, 24)
    out.sum().backward()
    assert planner.last_placement is not None and len(planner.last_rank_step_s) == 1
