"""Hostile input files never crash, hang or pass silently: hypothesis fuzz of every file a
user hands the project besides the table files (tests/storage/test_format_fuzz.py has those).

- model YAML (``mtrains plan --model``, ``load_model_spec``),
- hardware YAML (``mtrains plan --hardware``, ``load_topology``),
- trace files (``mtrains characterize``, ``read_trace_files``),
- checkpoint metadata (``latest``, ``trainer.json``, ``tiered.rank<N>.json``: ``read_chain``).

Each example mutates a real file: a node of the YAML tree replaced by an arbitrary value or
removed, the text cut or spliced, a trace's bytes changed or its tensors replaced. Through
the API the outcome must be a result or a ValueError whose message names the file; through
the CLI exit 0 or 2 with the file named on stderr and no traceback. A watchdog
(faulthandler) turns a hang into a failure with a traceback.
"""

from __future__ import annotations

import faulthandler
import json
import os
import shutil
import tempfile
import zlib
from pathlib import Path
from typing import Any, Callable, List

import pytest
import torch
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchrec_mtrains.checkpoint.chain import latest_checkpoint, read_chain, step_name
from torchrec_mtrains.checkpoint.types import FULL, ChunkSpec, PieceRecord, PieceSpec, StepManifest
from torchrec_mtrains.cli import main
from torchrec_mtrains.planner.hardware.topology import PROFILE_DIR, load_topology
from torchrec_mtrains.planner.model.model_spec import load_model_spec
from torchrec_mtrains.stats.characterize import read_trace_files
from torchrec_mtrains.stats.dlrm_trace import write_dlrm_file
from torchrec_mtrains.stats.synthetic import SyntheticTable, generate_dlrm_batch

_HANG_SECONDS = 60  # per example: the watchdog aborts the run with a traceback
_SETTINGS = settings(max_examples=150, deadline=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# A small model, so that planning a mutated copy stays fast.
_MODEL = """\
batch_size: 1024
target_qps: 50000
dtype: fp32
optimizer: rowwise_adagrad
tables:
  - {name: big, num_embeddings: 2000000, embedding_dim: 64, pooling_factor: 4, zipf_alpha: 1.05}
  - {name: hist, count: 3, num_embeddings: 100000, embedding_dim: 32, pooling_factor: 2,
     reuse_histogram: [0.069, 0.044, 0.068, 0.101, 0.121, 0.104, 0.073, 0.058, 0.052, 0.050, 0.049, 0.048, 0.048, 0.043, 0.031, 0.023, 0.019]}
  - {name: small, count: 5, num_embeddings: 1000, embedding_dim: 16, pooling_factor: 1, zipf_alpha: 0.8}
dense_layers: [[13, 64, 16], [64, 32, 1]]
"""

_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-2**70, max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
    st.sampled_from(["1.5GB", "12GiB", "-3", "0", "1e400", "nan", "lru", "fp16", "DRAM", "SSD", "cpu", ""]),
)
_VALUES = st.recursive(_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)), max_leaves=8)


@pytest.fixture(autouse=True)
def _watchdog():
    faulthandler.dump_traceback_later(_HANG_SECONDS, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


def _nodes(tree: Any, path: tuple = ()) -> List[tuple]:
    """Paths to every node of a YAML tree (keys of mappings, indices of lists)."""
    out = [path]
    if isinstance(tree, dict):
        for k, v in tree.items():
            out += _nodes(v, path + (k,))
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            out += _nodes(v, path + (i,))
    return out


def _mutate_tree(tree: Any, data: st.DataObject) -> Any:
    """``tree`` with one node replaced by an arbitrary value, or removed."""
    paths = [p for p in _nodes(tree) if p]
    path = data.draw(st.sampled_from(paths), label="node")
    parent = tree
    for k in path[:-1]:
        parent = parent[k]
    if data.draw(st.booleans(), label="remove"):
        del parent[path[-1]]
    else:
        parent[path[-1]] = data.draw(_VALUES, label="value")
    return tree


def _mutate_text(text: str, data: st.DataObject) -> str:
    """``text`` cut, spliced with arbitrary text, or with a byte flipped."""
    how = data.draw(st.sampled_from(["cut", "splice", "flip"]), label="how")
    at = data.draw(st.integers(0, len(text)), label="at")
    if how == "cut":
        return text[:at]
    if how == "splice":
        return text[:at] + data.draw(st.text(max_size=20), label="insert") + text[at:]
    chars = list(text)
    if chars and at < len(chars):
        chars[at] = chr(ord(chars[at]) ^ (1 << data.draw(st.integers(0, 6), label="bit")))
    return "".join(chars)


def _mutated_yaml(original: str, data: st.DataObject) -> str:
    if data.draw(st.booleans(), label="tree"):
        tree = _mutate_tree(yaml.safe_load(original), data)
        return yaml.safe_dump(tree, allow_unicode=True)
    return _mutate_text(original, data)


def _api_outcome(load: Callable[[str], Any], path: Path) -> None:
    """``load(path)`` returns, or raises a ValueError (or OSError) naming the file."""
    try:
        load(str(path))
    except (ValueError, OSError) as e:
        assert path.name in str(e), f"the error does not name the file: {e!r}"


def _cli_outcome(argv: List[str], path: Path, capsys: pytest.CaptureFixture) -> None:
    """The CLI exits 0 or 2; on 2 its one-line error names the file, with no traceback."""
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    assert code in (0, 2), (code, err[-2000:])
    assert "Traceback" not in err, err[-2000:]
    if code == 2:
        assert path.name in err, f"the error does not name the file: {err[-2000:]}"


# ------------------------------------------------------------------------ model YAML ----
@_SETTINGS
@given(data=st.data())
def test_model_yaml_never_crashes(data: st.DataObject, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "fuzzed_model.yaml"
    path.write_text(_mutated_yaml(_MODEL, data))
    _api_outcome(load_model_spec, path)
    _cli_outcome(["plan", "--model", str(path), "--hardware", "gpu-scm-node"], path, capsys)


# --------------------------------------------------------------------- hardware YAML ----
@_SETTINGS
@given(data=st.data(), profile=st.sampled_from(["local", "gpu-scm-node"]))
def test_hardware_yaml_never_crashes(data: st.DataObject, profile: str, tmp_path: Path,
                                     capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "fuzzed_hw.yaml"
    path.write_text(_mutated_yaml((PROFILE_DIR / f"{profile}.yaml").read_text(), data))
    model = tmp_path / "model.yaml"
    model.write_text(_MODEL)
    _api_outcome(load_topology, path)
    _cli_outcome(["plan", "--model", str(model), "--hardware", str(path)], path, capsys)


# ----------------------------------------------------------------------- trace files ----
_TABLES = [SyntheticTable(1000, 2.0, zipf_alpha=1.0), SyntheticTable(500, 1.0, zipf_alpha=0.8)]


@pytest.fixture(scope="module")
def trace_bytes(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    path = tmp_path_factory.mktemp("trace") / "t.pt"
    write_dlrm_file(path, generate_dlrm_batch(_TABLES, batch_size=64, seed=1))
    return path.read_bytes()


_TENSORS = st.one_of(
    st.builds(lambda n, lo, hi: torch.randint(lo, hi, (n,)), st.integers(0, 50), st.integers(-5, 0), st.integers(1, 9)),
    st.builds(lambda n: torch.rand(n), st.integers(0, 20)),
    st.builds(lambda a, b: torch.zeros(a, b, dtype=torch.int64), st.integers(0, 3), st.integers(0, 3)),
    st.just(torch.tensor(7)), st.just([1, 2, 3]), st.none(), st.text(max_size=5),
)


@_SETTINGS
@given(data=st.data())
def test_trace_file_never_crashes(data: st.DataObject, trace_bytes: bytes, tmp_path: Path,
                                  capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "fuzzed_trace.pt"
    if data.draw(st.booleans(), label="bytes"):
        raw = bytearray(trace_bytes)
        for _ in range(data.draw(st.integers(1, 8), label="flips")):
            at = data.draw(st.integers(0, len(raw) - 1), label="at")
            raw[at] ^= 1 << data.draw(st.integers(0, 7), label="bit")
        if data.draw(st.booleans(), label="cut"):
            raw = raw[: data.draw(st.integers(0, len(raw)), label="len")]
        path.write_bytes(bytes(raw))
    else:
        obj = data.draw(st.one_of(st.tuples(_TENSORS, _TENSORS, _TENSORS), st.lists(_TENSORS, max_size=4),
                                  _TENSORS), label="object")
        torch.save(obj, path)
    _api_outcome(lambda p: read_trace_files([Path(p)]), path)
    _cli_outcome(["characterize", str(path), "--batch-size", "16"], path, capsys)


# ------------------------------------------------------------- checkpoint metadata ----
def _write_checkpoint(directory: Path) -> Path:
    """A complete one-step chain's metadata (no tensor data: read_chain reads metadata only)."""
    step = directory / step_name(100)
    step.mkdir(parents=True)
    spec = PieceSpec(table="t", module="sparse.ebc.", row_offset=0, col_offset=0, rows=64, cols=8, table_rows=64,
                     table_cols=8, dtype="float32", state_values=1, seed=3, init_range=[-0.1, 0.1])
    piece = PieceRecord(spec, True, [ChunkSpec(key="sparse.ebc.t/r0_c0/0", row_lo=0, row_hi=64, count=64, crc32=5)])
    manifest = StepManifest(step=100, kind=FULL, base=100, parent=None, rank=0, world_size=1, pieces=[piece])
    (step / "tiered.rank0.json").write_text(manifest.to_json())
    (step / "trainer.json").write_text(json.dumps({"step": 100, "seed": 0, "losses": [0.5]}))
    (directory / "latest").write_text(step_name(100))
    return step


def _rewrite_manifest(text: str, data: st.DataObject) -> str:
    """A mutated body under a checksum that matches it (a hostile, not a damaged, file)."""
    outer = json.loads(text)
    body = _mutate_tree(json.loads(outer["manifest"]), data)
    new = json.dumps(body, sort_keys=True, default=str)
    return json.dumps({"crc32": zlib.crc32(new.encode()), "manifest": new})


@_SETTINGS
@given(data=st.data(), target=st.sampled_from(["latest", "trainer.json", "tiered.rank0.json"]))
def test_checkpoint_metadata_never_crashes(data: st.DataObject, target: str, tmp_path: Path) -> None:
    directory = Path(tempfile.mkdtemp(dir=tmp_path))
    step = _write_checkpoint(directory)
    path = directory / "latest" if target == "latest" else step / target
    original = path.read_text()
    if target == "tiered.rank0.json" and data.draw(st.booleans(), label="consistent crc"):
        path.write_text(_rewrite_manifest(original, data))
    elif target == "trainer.json" and data.draw(st.booleans(), label="tree"):
        path.write_text(json.dumps(_mutate_tree({"root": json.loads(original)}, data).get("root"), default=str))
    else:
        path.write_text(_mutate_text(original, data))
    try:
        found = latest_checkpoint(str(directory))
        if found is not None:
            assert os.path.realpath(found).startswith(os.path.realpath(directory) + os.sep), found
            read_chain(found)
    except ValueError as e:
        assert path.name in str(e) or str(path.parent) in str(e), f"the error does not name the file: {e!r}"
    finally:
        shutil.rmtree(directory, ignore_errors=True)
