"""`mtrains plan`: the report, its JSON keys, plots, and bad input (exit code 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.paths import MODEL_CONFIGS
from torchrec_mtrains.cli import main


def test_plan_json_has_the_contract_keys(capsys, tmp_path: Path) -> None:
    assert main(["plan", "--model", str(MODEL_CONFIGS / "prod_a.yaml"), "--hardware", "gpu-scm-node", "--json",
                 "--plot", str(tmp_path)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {"nodes", "nodes_hbm_ddr_only", "node_ratio", "predicted_qps", "tables"} <= set(report)
    assert report["nodes"] <= report["nodes_hbm_ddr_only"]
    assert report["node_ratio"] == pytest.approx(report["nodes_hbm_ddr_only"] / report["nodes"])
    assert report["predicted_qps"] >= report["target_qps"]
    assert len(report["tables"]) == 700 and {"name", "tier", "cache_rows", "hit_rate"} <= set(report["tables"][0])
    assert {p.name for p in tmp_path.iterdir()} == {"hit_rate_curves.png", "placement.png"}


def test_plan_prints_a_table(capsys) -> None:
    assert main(["plan", "--model", str(MODEL_CONFIGS / "prod_a.yaml"), "--hardware", "gpu-scm-node",
                 "--target-qps", "500000"]) == 0
    out = capsys.readouterr().out
    assert "nodes with all tiers:" in out and "node ratio" in out and "per node:" in out


@pytest.mark.parametrize(
    "model,extra,message",
    [
        ("batch_size: 8\ntarget_qps: 10\ntables: [{name: t, num_embeddings: -3, embedding_dim: 8, "
         "pooling_factor: 1, zipf_alpha: 1}]\n", [], "tables[0].num_embeddings=-3"),
        ("batch_size: 8\ntarget_qps: 10\nflavour: x\ntables: []\n", [], "unknown keys ['flavour']"),
        ("batch_size: 8\ntarget_qps: 10\ntables: [{name: t, num_embeddings: 100000000000, embedding_dim: 512, "
         "pooling_factor: 1, zipf_alpha: 1}]\n", ["--max-nodes", "2"], "does not fit even 2 nodes"),
        ("batch_size: 8\ntarget_qps: 10\ntables: [{name: t, num_embeddings: 10, embedding_dim: 8, "
         "pooling_factor: 1, zipf_alpha: 1}]\n", ["--hardware", "no-such-profile"], "no-such-profile"),
    ],
)
def test_plan_bad_input_exits_2(capsys, tmp_path: Path, model: str, extra, message: str) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(model)
    args = ["plan", "--model", str(path), "--hardware", "gpu-scm-node", *extra]
    assert main(args) == 2
    assert message in capsys.readouterr().err


def _table_rows(out: str) -> list:
    """The printed table's rows (between its header and the blank line after it)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("table ")) + 1
    return lines[start:lines.index("", start)]


def test_plan_groups_alike_tables_and_all_tables_lists_each(capsys) -> None:
    args = ["plan", "--model", str(MODEL_CONFIGS / "prod_a.yaml"), "--hardware", "gpu-scm-node"]
    assert main(args) == 0
    grouped = _table_rows(capsys.readouterr().out)
    assert main([*args, "--all-tables"]) == 0
    every = _table_rows(capsys.readouterr().out)
    # prod_a's 400 `small` tables are alike: one row; every row is one kind of table.
    assert [r for r in grouped if r.startswith("small_")] == [r for r in grouped if r.startswith("small_* (x400) ")]
    assert len([r for r in grouped if r.startswith("small_")]) == 1
    assert len(grouped) < 50
    counts = [int(r.split("(x")[1].split(")")[0]) if "* (x" in r else 1 for r in grouped]
    assert sum(counts) == 700
    assert len(every) == 700 and len({r.split()[0] for r in every}) == 700
    assert not any("* (x" in r for r in every)
    # Each grouped row prints what each of its tables prints but the name.
    figures = {r[24:] for r in every}
    assert {r[24:] for r in grouped} == figures


def test_alike_means_every_figure_equal() -> None:
    from torchrec_mtrains.commands.plan import alike_groups

    base = {"num_embeddings": 10, "embedding_dim": 8, "bytes": 320, "tier": "SSD", "cache_rows": 5,
            "hit_rate": 0.5, "bandwidth_bytes_per_s": 1e6, "unique_rows_per_step": 3.0}
    tables = [{**base, "name": "s_0"}, {**base, "name": "s_1"}, {**base, "name": "s_2", "hit_rate": 0.5001},
              {**base, "name": "s_3", "tier": "SCM"}, {**base, "name": "s_4"}]
    assert [(label, t["name"]) for label, t in alike_groups(tables)] == [
        ("s_* (x3)", "s_0"), ("s_2", "s_2"), ("s_3", "s_3")]
