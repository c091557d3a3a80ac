"""Builds the C++ extension ``torchrec_mtrains._C``; metadata lives in pyproject.toml.

Sources: every ``csrc/**/*.cc`` and ``csrc/**/*.cpp`` except files named ``test_*`` and
anything under ``csrc/tests`` (standalone C++ test drivers, built by scripts/sanitize.sh),
globbed at build time. Object files are kept in
``build/ext`` so that ninja recompiles only what changed, even under
``pip install -e`` (which otherwise builds in a fresh temporary directory).

Release build by default: ``-O3`` without debug info (``-g0`` overrides the ``-g`` that
Python's own CFLAGS carry), so the wheel's extension is small. ``MTRAINS_DEBUG=1`` builds with
``-g`` into ``build/ext-debug`` (the two builds keep their objects apart, so switching does not
recompile everything), for gdb and perf; the sanitizer drivers (scripts/sanitize.sh) build with
debug info by themselves.

io_uring: when liburing's header and library link a probe program that uses what
csrc/storage/file_device.cc needs, the io_uring engine is built (MTRAINS_HAVE_LIBURING,
``-luring``); otherwise, or with ``MTRAINS_NO_LIBURING=1``, the extension has only the
pread/pwrite thread-pool engine, which ``io_engine="auto"`` then uses (with a warning saying
why) and ``io_engine="uring"`` refuses.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension, is_ninja_available

ROOT = Path(__file__).resolve().parent
CSRC = ROOT / "csrc"
DEBUG = os.environ.get("MTRAINS_DEBUG", "0") not in ("", "0")

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


# Uses what the io_uring engine needs: liburing >= 2.2 (io_uring_sqe_set_data64) and the
# COOP_TASKRUN flag of its headers.
_LIBURING_PROBE = """#include <liburing.h>
int main() {
  io_uring ring;
  io_uring_params p{};
  p.flags = IORING_SETUP_COOP_TASKRUN;
  if (io_uring_queue_init_params(4, &ring, &p) != 0) return 0;
  io_uring_sqe* sqe = io_uring_get_sqe(&ring);
  if (sqe != nullptr) io_uring_sqe_set_data64(sqe, 1);
  io_uring_queue_exit(&ring);
  return 0;
}
"""


def _liburing() -> tuple[bool, str]:
    """Whether to build the io_uring engine, and why (for the build log)."""
    if os.environ.get("MTRAINS_NO_LIBURING", "0") not in ("", "0"):
        return False, "MTRAINS_NO_LIBURING is set"
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx.split()[0]) is None:
        return False, f"no C++ compiler {cxx!r} to probe liburing with"
    with tempfile.TemporaryDirectory(prefix="mtrains-liburing-") as tmp:
        src = Path(tmp) / "probe.cc"
        src.write_text(_LIBURING_PROBE)
        result = subprocess.run([*cxx.split(), "-std=c++17", str(src), "-o", str(Path(tmp) / "probe"), "-luring"],
                                capture_output=True, text=True)
    if result.returncode != 0:
        first = (result.stderr.strip().splitlines() or ["(no output)"])[0]
        return False, f"liburing >= 2.2 (headers and library) not found: {first}"
    return True, "liburing found"


class _BuildExt(BuildExtension):
    def finalize_options(self) -> None:
        super().finalize_options()
        self.build_temp = str(ROOT / "build" / ("ext-debug" if DEBUG else "ext"))

    def build_extensions(self) -> None:
        # Probed here, not at import, so that metadata-only runs of setup.py skip it.
        have, why = _liburing()
        print(f"setup.py: io_uring engine {'built' if have else 'not built'} ({why})"
              + ("" if have else "; file I/O uses the pread/pwrite thread pool"), file=sys.stderr)
        if have:
            for ext in self.extensions:
                ext.define_macros.append(("MTRAINS_HAVE_LIBURING", "1"))
                ext.libraries.append("uring")
        super().build_extensions()


setup(
    ext_modules=[
        CppExtension(
            name="torchrec_mtrains._C",
            sources=_sources(),
            include_dirs=[str(CSRC)],
            # -fno-finite-loops: C++ lets GCC assume a loop without side effects ends, and it
            # then deletes one whose body is only __builtin_prefetch (a row's lines prefetched
            # over a length known at run time): without it the row movers' and the Adam update's
            # prefetches were not in the binary at all.
            extra_compile_args={"cxx": ["-O3", "-std=c++17", "-msse4.2", "-fno-math-errno", "-fno-finite-loops",
                                        "-fno-semantic-interposition", "-Wall", "-fopenmp",
                                        "-g" if DEBUG else "-g0"]},
            extra_link_args=["-fopenmp"],
        )
    ],
    cmdclass={"build_ext": _BuildExt.with_options(use_ninja=is_ninja_available())},
)
