"""The package as a user installs it: a wheel built with pip, installed into a fresh virtual
environment outside the source tree, imported and used from a directory outside it.

The fresh environment sees the pinned dependencies (torch, fbgemm-gpu-cpu, torchrec) through a
.pth file naming this interpreter's site-packages, so nothing is downloaded; the wheel build
reuses the objects in build/ext (a link after an up-to-date in-place build).
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import textwrap
import venv
import zipfile
from pathlib import Path

import pytest

from tests.support.paths import REPO_ROOT

pytestmark = pytest.mark.slow

# Run inside the fresh environment, from a directory outside the tree.
_USE = textwrap.dedent("""
    import sys
    from pathlib import Path

    import torch

    import torchrec_mtrains
    from torchrec_mtrains import Tier
    from torchrec_mtrains.kernels import TieredEmbeddingBags
    from torchrec_mtrains.storage import BlockStore

    print("FILE", torchrec_mtrains.__file__)
    here = Path.cwd()

    # BlockStore round trip, through a reopen.
    ids = torch.tensor([3, 17, 999])
    rows = torch.arange(3 * 8, dtype=torch.float32).reshape(3, 8)
    with BlockStore(here / "t.tbl", 1000, 8, state_dim=0, dram_cache_mb=0) as store:
        store.write(ids, rows)
        store.flush()
    with BlockStore.open(here / "t.tbl", dram_cache_mb=0) as store:
        assert torch.equal(store.read(ids), rows), store.read(ids)
        print("ENGINE", store.io_engine)

    # One training step of an SSD table: the looked-up rows change.
    emb = TieredEmbeddingBags([(10_000, 16)], tier=Tier.SSD, cache_load_factor=0.1,
                              storage_dir=str(here / "tiers"), learning_rate=0.5)
    indices, offsets = torch.tensor([1, 2, 3, 2]), torch.tensor([0, 2, 4])
    before = emb(indices, offsets).detach().clone()
    emb(indices, offsets).sum().backward()
    after = emb(indices, offsets).detach()
    assert before.shape == (2, 16) and not torch.equal(before, after)
    print("OK")
""")


def _wheel(out: Path) -> Path:
    env = {**os.environ, "MAX_JOBS": os.environ.get("MAX_JOBS", "2")}
    env.pop("PYTHONPATH", None)
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--disable-pip-version-check", "--no-build-isolation", "--no-deps",
         "-q", "-w", str(out), str(REPO_ROOT)],
        capture_output=True, text=True, env=env, timeout=1800)
    assert result.returncode == 0, result.stdout + result.stderr
    wheels = list(out.glob("torchrec_mtrains-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def test_wheel_installs_and_runs_outside_the_tree(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path / "dist")

    # The library only: no benchmarks, tests or examples; the extension and the profiles in.
    names = zipfile.ZipFile(wheel).namelist()
    dist_info = "-".join(wheel.name.split("-")[:2]) + ".dist-info"  # torchrec_mtrains-0.1.0.dist-info
    assert {n.split("/")[0] for n in names} == {"torchrec_mtrains", dist_info}, names
    assert any(n.startswith("torchrec_mtrains/_C.") and n.endswith(".so") for n in names), names
    assert "torchrec_mtrains/planner/hardware/profiles/local.yaml" in names
    assert "torchrec_mtrains/commands/bench.py" in names
    assert not [n for n in names if "benchmarks" in n.split("/") or "/tests/" in n or n.endswith(".cc")]

    # A fresh environment that borrows the pinned dependencies of this one.
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    py = env_dir / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (Path(site) / "mtrains_test_deps.pth").write_text("".join(f"{d}\n" for d in sorted(deps)))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(py), "install", "--disable-pip-version-check", "--no-deps",
         "--no-index", "-q", str(wheel)], capture_output=True, text=True, env=env, timeout=600)
    assert install.returncode == 0, install.stdout + install.stderr

    run_dir = tmp_path / "elsewhere"
    run_dir.mkdir()
    result = subprocess.run([str(py), "-c", _USE], cwd=run_dir, capture_output=True, text=True, env=env,
                            timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)
    assert Path(lines["FILE"]).resolve().is_relative_to(env_dir.resolve()), lines["FILE"]
    assert not Path(lines["FILE"]).resolve().is_relative_to(REPO_ROOT), lines["FILE"]
    assert lines["ENGINE"] in ("io_uring", "threads") and result.stdout.rstrip().endswith("OK")

    # The console script, and the benchmarks refusing to run without a source checkout.
    mtrains = env_dir / "bin" / "mtrains"
    assert subprocess.run([str(mtrains), "--help"], cwd=run_dir, capture_output=True, text=True, env=env,
                          timeout=120).returncode == 0
    bench = subprocess.run([str(mtrains), "bench", "store"], cwd=run_dir, capture_output=True, text=True, env=env,
                           timeout=120)
    assert bench.returncode == 2 and "source checkout" in bench.stderr, bench.stderr
