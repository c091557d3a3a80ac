"""Every Python snippet of docs/user-guide.md runs as written.

A snippet is a ```python block preceded by ``<!-- snippet NAME -->`` or
``<!-- snippet NAME after OTHER -->``; one with ``after`` runs appended to OTHER (and to what
OTHER continues), as the page tells a reader to. Each runs in a fresh interpreter in a scratch
directory (its relative storage paths land there), as a world of one gloo rank where it makes
one.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest

from tests.support.crash_helpers import run
from tests.support.paths import DOCS
from tests.support.ports import OS_PICKED_PORT

GUIDE = DOCS / "user-guide.md"
HANG_GUARD_S = 600  # only against a hang: each snippet takes seconds
_MARK = re.compile(r"<!-- snippet (?P<name>[\w-]+)(?: after (?P<after>[\w-]+))? -->\s*\n```python\n(?P<code>.*?)\n```",
                   re.S)


def snippets() -> Dict[str, Tuple[Optional[str], str]]:
    """NAME -> (the snippet it continues, its code)."""
    text = GUIDE.read_text()
    found = {m["name"]: (m["after"], m["code"]) for m in _MARK.finditer(text)}
    assert len(found) == text.count("```python"), "a ```python block of the user guide has no snippet marker"
    return found


def program(name: str, found: Dict[str, Tuple[Optional[str], str]]) -> str:
    parts: List[str] = []
    while name is not None:
        after, code = found[name]
        parts.insert(0, code)
        name = after
    return "\n\n".join(parts) + "\n"


def test_every_python_block_is_a_snippet_and_every_after_exists() -> None:
    found = snippets()
    assert {"kernel", "model", "shard", "checkpoint", "key_value", "planner", "sequences",
            "sequences-key-value"} <= set(found)
    assert all(after in found for after, _ in found.values() if after is not None)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(snippets()))
def test_snippet_runs(tmp_path: Path, name: str) -> None:
    script = tmp_path / f"{name}.py"
    script.write_text(program(name, snippets()))
    env = dict(os.environ, MASTER_PORT=OS_PICKED_PORT, OMP_NUM_THREADS="1")
    proc = run([sys.executable, str(script)], env, timeout=HANG_GUARD_S, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-4000:]
