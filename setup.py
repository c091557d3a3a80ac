"""Builds the C++ extension ``torchrec_mtrains._C``; metadata lives in pyproject.toml.

Sources: every ``csrc/**/*.cc`` and ``csrc/**/*.cpp`` except files named ``test_*`` and
anything under ``csrc/tests`` (standalone C++ test drivers, built by scripts/sanitize.sh),
globbed at build time. Object files are kept in
``build/ext`` so that ninja recompiles only what changed, even under
``pip install -e`` (which otherwise builds in a fresh temporary directory).
"""

from __future__ import annotations

import os
import sysconfig
from pathlib import Path

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension, is_ninja_available

ROOT = Path(__file__).resolve().parent
CSRC = ROOT / "csrc"

# pip does not put the virtual environment's bin/ (where the `ninja` package puts
# its binary) on PATH when it runs this file; torch looks for ninja on PATH.
os.environ["PATH"] = os.pathsep.join([sysconfig.get_path("scripts"), os.environ.get("PATH", "")])


def _sources() -> list[str]:
    files = sorted(
        p.relative_to(ROOT).as_posix()
        for pattern in ("**/*.cc", "**/*.cpp")
        for p in CSRC.glob(pattern)
        if not p.name.startswith("test_") and "tests" not in p.relative_to(CSRC).parts
    )
    if not files:
        raise SystemExit(f"setup.py: no C++ sources (*.cc, *.cpp) under {CSRC}")
    return files


class _BuildExt(BuildExtension):
    def finalize_options(self) -> None:
        super().finalize_options()
        self.build_temp = str(ROOT / "build" / "ext")


setup(
    ext_modules=[
        CppExtension(
            name="torchrec_mtrains._C",
            sources=_sources(),
            include_dirs=[str(CSRC)],
            extra_compile_args={"cxx": ["-O3", "-std=c++17", "-msse4.2", "-Wall"]},
            libraries=["uring"],
        )
    ],
    cmdclass={"build_ext": _BuildExt.with_options(use_ninja=is_ninja_available())},
)
