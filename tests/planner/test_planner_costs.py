"""The perf model's cost terms: the tiered kernel's own cost, CPU contention by core count,
the dense part from the model's layers, the framework's cost, and their profile keys."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from torchrec_mtrains import Tier
from torchrec_mtrains.planner import parse_model_spec
from torchrec_mtrains.planner.hardware.timing import nonneg_fit
from torchrec_mtrains.planner.hardware.topology import parse_topology, topology_to_yaml
from torchrec_mtrains.planner.model.estimator import dense_step_seconds, table_cost
from torchrec_mtrains.planner.model.model_spec import DenseSpec, dense_spec_of
from torchrec_mtrains.planner.model.placement import place
from torchrec_mtrains.planner.types import ComputeSpec, TieredTopology, TierSpec

G, M = 2**30, 2**20


def _node(cores: int, **compute: float) -> TieredTopology:
    spec = ComputeSpec(2e9, 0.0005, 0.0, 1e-6, **{"step_background_cpu_s": 0.004, "lookup_background_cpu_s": 5e-8,
                                                    **compute})
    return TieredTopology("t", "cpu", 2, {Tier.DRAM: TierSpec(4 * G, 5e9, 5e9), Tier.SCM: TierSpec(16 * G, 2e9, 1e9)},
                          spec, cores_per_node=cores)


def _model(**top: object):
    doc = {"batch_size": 4096, "target_qps": 1.0, "tables": [
        {"name": f"s{i}", "num_embeddings": 200_000, "embedding_dim": 64, "pooling_factor": 2, "zipf_alpha": 1.2}
        for i in range(4)] + [
        {"name": "big", "num_embeddings": 2_000_000, "embedding_dim": 64, "pooling_factor": 10, "zipf_alpha": 0.9}]}
    return parse_model_spec({**doc, **top})


def test_worker_threads_cpu_is_shared_by_the_cores_of_a_rank() -> None:
    table = _model().tables[0]
    lookups = 4096 * 2
    background = 0.004 + 5e-8 * lookups
    costs = {c: table_cost(table, Tier.SCM, 40_000, _node(c), 4096).compute_s for c in (2, 8, 64)}
    assert costs[2] - costs[8] == pytest.approx(background * (1 - 1 / 4))
    assert costs[8] - costs[64] == pytest.approx(background * (1 / 4 - 1 / 32))
    # A profile without cores_per_node: one core per rank, as a CPU node was costed before.
    unknown = dataclasses.replace(_node(2), cores_per_node=None)
    assert table_cost(table, Tier.SCM, 40_000, unknown, 4096).compute_s == pytest.approx(costs[2])
    # Whole in DRAM: no tiered kernel, no worker threads, whatever the cores.
    assert table_cost(table, Tier.DRAM, 0, _node(2), 4096).compute_s == pytest.approx(
        table_cost(table, Tier.DRAM, 0, _node(64), 4096).compute_s)


def test_a_miss_costs_its_load_and_its_write_back_on_the_rank_cores() -> None:
    """The row path's CPU per miss (measured per row loaded and per row written back) is
    charged to the rank's cores; a profile without those figures charges row_cpu_cost
    twice, as before."""
    table = _model().tables[0]

    def cost(cores: int, **scm: float) -> tuple[float, float]:
        node = _node(cores)
        tiers = {**node.tiers, Tier.SCM: dataclasses.replace(node.tiers[Tier.SCM], **scm)}
        c = table_cost(table, Tier.SCM, 40_000, dataclasses.replace(node, tiers=tiers), 4096)
        unique = table.locality.unique_rows_per_step
        return c.compute_s, unique * (1 - c.hit_rate)

    base, misses = cost(4)
    measured, _ = cost(4, miss_cpu_s=3e-6, write_back_cpu_s=1e-7)
    assert measured - base == pytest.approx(misses * (3e-6 + 1e-7) / 2)  # 2 cores per rank
    assert cost(16, miss_cpu_s=3e-6, write_back_cpu_s=1e-7)[0] - cost(16)[0] == pytest.approx(
        misses * (3e-6 + 1e-7) / 8)
    old, _ = cost(4, row_cpu_s=1e-6)
    assert old - base == pytest.approx(misses * 2e-6 / 2)
    only_load, _ = cost(4, row_cpu_s=1e-6, miss_cpu_s=3e-6)  # the write-back falls back to row_cpu_s
    assert only_load - base == pytest.approx(misses * 4e-6 / 2)
    # The profile keys round-trip.
    node = _node(4)
    tiers = {**node.tiers, Tier.SCM: dataclasses.replace(node.tiers[Tier.SCM], miss_cpu_s=3e-6, write_back_cpu_s=1e-7,
                                                         first_touch_cpu_s=6e-7)}
    topo = dataclasses.replace(node, tiers=tiers)
    text = topology_to_yaml(topo)
    assert "miss_cpu_cost: 3us" in text and "write_back_cpu_cost: 100ns" in text and "first_touch_cpu_cost: 600ns" in text
    assert parse_topology(text) == topo


def test_a_rows_first_miss_reads_nothing_from_the_ssd_tier() -> None:
    """A table that gives rows_written over run_steps: each step's share of the run's first
    touches is read from no device (the SSD tier initialises them in place) and costs the
    CPU of making a row instead of loading one; every miss is still written back. Without
    run_steps every miss is a read."""
    ssd = TierSpec(64 * G, 1e9, 8e8, read_iops=50_000, write_iops=1e6, access_bytes=4096, miss_cpu_s=5e-6,
                   write_back_cpu_s=2e-7, first_touch_cpu_s=6e-7)
    node = dataclasses.replace(_node(2), tiers={**_node(2).tiers, Tier.SSD: ssd})
    entry = {"name": "big", "num_embeddings": 50_000_000, "embedding_dim": 64, "pooling_factor": 10,
             "zipf_alpha": 0.9, "rows_written": 3_000_000}
    unknown = parse_model_spec({"batch_size": 4096, "target_qps": 1.0, "tables": [entry]}).tables[0]
    run = parse_model_spec({"batch_size": 4096, "target_qps": 1.0,
                            "tables": [{**entry, "run_steps": 1000}]}).tables[0]
    assert run.first_touches_per_step(Tier.SSD) == 3000 and run.first_touches_per_step(Tier.SCM) == 0
    before, after = (table_cost(t, Tier.SSD, 100_000, node, 4096) for t in (unknown, run))
    misses = unknown.locality.unique_rows_per_step * (1 - before.hit_rate)
    assert misses > 3000 and after.hit_rate == before.hit_rate
    assert before.io_s[Tier.SSD] - after.io_s[Tier.SSD] == pytest.approx(3000 / 50_000)  # 3,000 fewer random reads
    assert before.compute_s - after.compute_s == pytest.approx(3000 * (5e-6 - 6e-7))  # made, not loaded; 1 core a rank
    # A profile without first_touch_cpu_cost charges a first touch as a load.
    unprobed = dataclasses.replace(node, tiers={**node.tiers, Tier.SSD: dataclasses.replace(ssd, first_touch_cpu_s=None)})
    assert table_cost(run, Tier.SSD, 100_000, unprobed, 4096).compute_s == pytest.approx(before.compute_s)
    with pytest.raises(ValueError, match=r"tables\[0\]\.run_steps needs rows_written"):
        parse_model_spec({"batch_size": 4096, "target_qps": 1.0,
                          "tables": [{**entry, "rows_written": None, "run_steps": 1000}]})


def test_lookup_cost_is_on_the_critical_path_of_tiered_tables() -> None:
    table = _model().tables[0]
    base, more = _node(64), _node(64, lookup_s=1e-7)
    assert (table_cost(table, Tier.SCM, 40_000, more, 4096).compute_s
            - table_cost(table, Tier.SCM, 40_000, base, 4096).compute_s) == pytest.approx(1e-7 * 4096 * 2)
    assert table_cost(table, Tier.DRAM, 0, more, 4096).compute_s == table_cost(table, Tier.DRAM, 0, base, 4096).compute_s


def test_few_cores_keep_more_tables_whole_in_dram() -> None:
    model = dataclasses.replace(_model(), target_qps=None)
    budget = {Tier.DRAM: 2 * (200_000 * model.tables[0].row_bytes + 60 * M)}
    whole, qps = {}, {}
    for cores in (2, 64):
        p = place(model, _node(cores), 2, budget_bytes=budget)
        whole[cores] = sorted(n for n, t in p.tables.items() if t.tier is Tier.DRAM and t.cache_rows == 0)
        qps[cores] = p.predicted_qps
    assert len(whole[2]) > len(whole[64])
    assert qps[2] < qps[64]  # the slowdown is seen


def test_dense_cost_comes_from_the_model_layers() -> None:
    spec = ComputeSpec(1e9, dense_s_per_sample=1e-4, dense_mac_s=1e-10, dense_activation_s=1e-8, dense_layer_s=1e-3,
                       framework_step_s=0.005, framework_table_s=0.0002)
    node = TieredTopology("t", "cpu", 2, {Tier.DRAM: TierSpec(4 * G, 5e9, 5e9)}, spec)
    small = _model(dense_layers=[[13, 128, 32], [98, 256, 128, 1]])
    assert small.dense == DenseSpec(13 * 128 + 128 * 32 + 98 * 256 + 256 * 128 + 128, 128 + 32 + 256 + 128 + 1, 5)
    framework = 0.005 + 0.0002 * 5
    per_rank = 2048 * (small.dense.macs_per_sample * 1e-10 + small.dense.outputs_per_sample * 1e-8) + 5 * 1e-3
    assert dense_step_seconds(small, node, 2) == pytest.approx(per_rank + framework)
    # A larger MLP costs more; a model without its layers costs the profile's per-sample figure.
    large = _model(dense_layers=[[13, 512, 256, 64], [415, 512, 512, 256, 1]])
    assert dense_step_seconds(large, node, 2) > 3 * dense_step_seconds(small, node, 2) - 2 * framework
    assert dense_step_seconds(_model(), node, 2) == pytest.approx(1e-4 * 2048 + framework)
    # The input pipeline's cost per sample of the rank's batch (MODEL.yaml input_time_per_sample).
    fed = _model(dense_layers=[[13, 128, 32], [98, 256, 128, 1]], input_time_per_sample="5us")
    assert fed.input_s_per_sample == pytest.approx(5e-6)
    assert dense_step_seconds(fed, node, 2) == pytest.approx(per_rank + framework + 2048 * 5e-6)


@pytest.mark.parametrize("layers,message", [
    ([], "non-empty list"), ([[13]], "at least an input"), ([[13, "x"]], "dense_layers[0][1]"),
    ("13-128", "non-empty list"), ([[13, 0]], "must be > 0"),
])
def test_dense_layers_errors_name_the_field(layers: object, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        _model(dense_layers=layers)


def test_dense_spec_of_a_module_skips_the_embedding_tables() -> None:
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
    from torchrec.models.dlrm import DLRM

    ebc = EmbeddingBagCollection(tables=[EmbeddingBagConfig(name=f"t{i}", num_embeddings=100, embedding_dim=32,
                                                            feature_names=[f"f{i}"]) for i in range(11)],
                                 device=torch.device("meta"))
    dense = dense_spec_of(DLRM(ebc, 13, [128, 32], [256, 128, 1]), skip=[ebc])
    assert dense == DenseSpec.of_shapes([(13, 128), (128, 32), (98, 256), (256, 128), (128, 1)])
    assert dense_spec_of(torch.nn.ReLU()) is None


def test_framework_cost_per_table_grows_with_the_batch() -> None:
    """A table's framework cost has a fixed part and a part per sample of the rank's batch."""
    spec = ComputeSpec(1e9, dense_s_per_sample=0.0, framework_step_s=0.005, framework_table_s=5e-5,
                       framework_table_sample_s=4e-7)
    node = TieredTopology("t", "cpu", 2, {Tier.DRAM: TierSpec(4 * G, 5e9, 5e9)}, spec)
    model = _model()
    samples = model.batch_size / 2
    want = 0.005 + len(model.tables) * (5e-5 + 4e-7 * samples) + samples * model.input_s_per_sample
    assert dense_step_seconds(model, node, 2) == pytest.approx(want)


def test_framework_probe_fit_recovers_its_terms(monkeypatch: pytest.MonkeyPatch) -> None:
    """Jobs timed as the model says plus a known framework cost give that cost back."""
    from torchrec_mtrains.planner.hardware import probe_framework as pf
    step, table, sample, byte = 0.008, 6e-5, 4.5e-7, 2e-9

    def modeled(tables: int, batch: int, dim: int) -> float:
        return 1e-3 * tables + 2e-6 * batch + 1e-8 * batch * dim

    def run(tables: int, batch: int, steps: int, ranks: int, row_wise: int = 0, dim: int = pf.DIM) -> float:
        return modeled(tables, batch, dim) + step + tables * (table + (sample + byte * 4 * dim) * batch)

    monkeypatch.setattr(pf, "_run", run)
    got, notes = pf.framework_costs(3, modeled, ranks=1, repeats=1)
    assert got["framework_step_s"] == pytest.approx(step)
    assert got["framework_table_s"] == pytest.approx(table)
    assert got["framework_table_sample_s"] == pytest.approx(sample)
    assert got["framework_output_byte_s"] == pytest.approx(byte)
    assert "framework_table_sample_cost" in notes and "framework_output_byte_cost" in notes


def test_framework_cost_grows_with_the_pooled_outputs_bytes() -> None:
    """Bag tables' pooled outputs cost the framework per byte; a sequence table's output is
    charged with its lookups instead."""
    spec = ComputeSpec(1e9, dense_s_per_sample=0.0, framework_output_byte_s=3e-9)
    node = TieredTopology("t", "cpu", 2, {Tier.DRAM: TierSpec(4 * G, 5e9, 5e9)}, spec)
    model = parse_model_spec({"batch_size": 4096, "target_qps": 1.0, "tables": [
        {"name": "bag", "num_embeddings": 1000, "embedding_dim": 64, "pooling_factor": 3, "zipf_alpha": 1.1},
        {"name": "wide_bag", "num_embeddings": 1000, "embedding_dim": 128, "pooling_factor": 1, "zipf_alpha": 1.1},
        {"name": "seq", "num_embeddings": 1000, "embedding_dim": 256, "pooling_factor": 5, "zipf_alpha": 1.1,
         "sequence": True}]})
    without = dense_step_seconds(model, TieredTopology("t", "cpu", 2, node.tiers, ComputeSpec(1e9)), 2)
    samples = model.batch_size / 2
    assert dense_step_seconds(model, node, 2) == pytest.approx(without + samples * 4 * (64 + 128) * 3e-9)


def test_profile_keys_of_the_new_figures_round_trip() -> None:
    topo = _node(16, lookup_s=9.6e-8, dense_mac_s=8.5e-11, dense_activation_s=3.3e-9, dense_layer_s=5.7e-4,
                 framework_step_s=6.3e-3, framework_table_s=8.3e-4, framework_table_sample_s=4.4e-7,
                 row_wise_group_s=4e-4, row_wise_setup_s=1.2e-3, framework_output_byte_s=2.5e-9)
    text = topology_to_yaml(topo)
    for key in ("cores_per_node: 16", "lookup_cost:", "step_background_cpu:", "lookup_background_cpu:",
                "dense_mac_cost:", "dense_activation_cost:", "dense_layer_cost:", "framework_step_cost:",
                "framework_table_cost:", "framework_table_sample_cost: 440ns", "row_wise_group_cost: 400us",
                "row_wise_setup_cost: 1.2ms", "framework_output_byte_cost: 2.5ns"):
        assert key in text
    assert parse_topology(text) == topo
    # Profiles without them read and write as before.
    old = dataclasses.replace(topo, cores_per_node=None, compute=ComputeSpec(2e9, 0.0005, 0.0, 1e-6))
    assert "cores_per_node" not in topology_to_yaml(old) and "lookup_cost" not in topology_to_yaml(old)
    assert parse_topology(topology_to_yaml(old)) == old


@pytest.mark.parametrize("cores", [0, -2, 1.5, True, "8"])
def test_bad_cores_per_node_is_named(cores: object) -> None:
    text = topology_to_yaml(_node(2)).replace("cores_per_node: 2", f"cores_per_node: {cores!r}")
    with pytest.raises(ValueError, match="cores_per_node"):
        parse_topology(text)


def test_nonneg_fit_recovers_costs_and_drops_negative_ones() -> None:
    points = [((1.0, x, y), 0.002 + 3e-7 * x + 5e-8 * y) for x, y in ((20, 20), (40_000, 28_000), (40_000, 1024))]
    assert nonneg_fit(points) == pytest.approx([0.002, 3e-7, 5e-8], rel=1e-6)
    noisy = [((1.0, x), 0.001 - 1e-9 * x) for x in (10, 1000, 5000)]  # a negative slope is noise
    fit = nonneg_fit(noisy)
    assert fit[1] == 0.0 and fit[0] > 0
