"""A recording layer over the file operations under one directory, and the crash images a
power cut could leave of it (the power-loss tests of ScmStore and of checkpoint chains).

``FsRecorder.patch()`` wraps ``os.fsync``, ``os.replace``, ``os.rename``, ``os.link``,
``os.mkdir``, ``os.unlink`` and ``os.rmdir``: after each call that concerns the recorded
root, the recorder snapshots the tree (every directory's entries, every file's identity and
bytes, deduplicated). Workloads add events of their own: ``synced(path)`` for data made
durable another way (an msync) and ``mark(value)`` for what the workload promises (a save
that returned). Files are told apart by inode while they exist (a reused inode number is a
new file).

The crash model at an event (the power goes right after it):
  - a directory's entries are those of its last fsync before the point (nothing for one
    never synced; what existed when recording began counts as synced); each entry created,
    replaced or removed since may or may not have reached the disk, independently;
  - a file's bytes are those of its last fsync (nothing for one never synced), or, for
    writes since, any 4 KiB page may hold its bytes as of any event since (the kernel
    writes pages back at any time), some pages torn at 512-byte sectors against the
    durable bytes; the length is one of those states' lengths.
Variant 0 of a point keeps only what was synced, variant 1 everything (what a killed
process leaves), the others draw at random.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

PAGE = 4096
SECTOR = 512

# A directory entry: ("d", None) for a directory, ("f", file id) for a file.
Entry = Tuple[str, Optional[int]]


@dataclass
class Tree:
    dirs: Dict[str, Dict[str, Entry]]  # relative dir ("" = root) -> name -> entry
    contents: Dict[int, str]           # file id -> blob digest


@dataclass
class Event:
    kind: str
    tree: Tree
    synced_dir: Optional[str] = None   # relative dir whose entries this event made durable
    synced_file: Optional[int] = None  # file id whose bytes this event made durable
    mark: Any = None


@dataclass
class FsRecorder:
    root: Path
    # Files (relative paths) whose bytes are not the workload's to keep (another store's
    # file hard-linked into the tree): their entries are recorded, their bytes read as empty.
    opaque: Callable[[str], bool] = lambda rel: False
    events: List[Event] = field(default_factory=list)
    blobs: Dict[str, bytes] = field(default_factory=dict)
    _ids: Dict[int, int] = field(default_factory=dict)  # inode -> file id, while it exists
    _next_id: int = 0
    _busy: bool = False

    def __post_init__(self) -> None:
        self.root = Path(self.root).resolve()
        tree = self._snapshot()
        # What exists when recording begins is durable.
        self.events.append(Event("start", tree))
        self._baseline = tree

    # ----------------------------------------------------------------- recording ----
    def mark(self, value: Any) -> None:
        self.events.append(Event("mark", self._snapshot(), mark=value))

    def synced(self, path: os.PathLike) -> None:
        """Records that ``path``'s bytes were made durable (e.g. by msync)."""
        tree = self._snapshot()
        self.events.append(Event("sync", tree, synced_file=self._ids[os.stat(path).st_ino]))

    def written(self) -> None:
        """Records the tree after writes the patched calls do not see (stores into an mmap)."""
        self.events.append(Event("write", self._snapshot()))

    @contextlib.contextmanager
    def patch(self) -> Iterator["FsRecorder"]:
        saved = {n: getattr(os, n) for n in ("fsync", "replace", "rename", "link", "mkdir", "unlink", "rmdir")}

        def wrap(name: str):
            real = saved[name]

            def call(*args, **kwargs):
                result = real(*args, **kwargs)
                if not self._busy:
                    self._after(name, args, kwargs)
                return result
            return call

        for n in saved:
            setattr(os, n, wrap(n))
        try:
            yield self
        finally:
            for n, f in saved.items():
                setattr(os, n, f)

    def _after(self, name: str, args: tuple, kwargs: dict) -> None:
        self._busy = True
        try:
            if name == "fsync":
                fd = args[0] if isinstance(args[0], int) else args[0].fileno()
                path = Path(os.readlink(f"/proc/self/fd/{fd}"))
                if not self._inside(path):
                    return
                tree = self._snapshot()
                if stat.S_ISDIR(os.fstat(fd).st_mode):
                    self.events.append(Event("fsync_dir", tree, synced_dir=self._rel(path)))
                else:
                    self.events.append(Event("fsync", tree, synced_file=self._ids.get(os.fstat(fd).st_ino)))
                return
            paths = [a for a in args[:2] if isinstance(a, (str, bytes, os.PathLike))]
            dir_fd = kwargs.get("dir_fd") or kwargs.get("src_dir_fd")
            base = Path(os.readlink(f"/proc/self/fd/{dir_fd}")) if dir_fd is not None else Path.cwd()
            if any(self._inside(base / os.fsdecode(p)) for p in paths):
                self.events.append(Event(name, self._snapshot()))
        finally:
            self._busy = False

    def _inside(self, path: Path) -> bool:
        path = Path(os.path.abspath(path))
        return path == self.root or self.root in path.parents

    def _rel(self, path: Path) -> str:
        rel = os.path.relpath(os.path.abspath(path), self.root)
        return "" if rel == "." else rel

    def _snapshot(self) -> Tree:
        dirs: Dict[str, Dict[str, Entry]] = {}
        contents: Dict[int, str] = {}
        seen = set()
        for here, subdirs, files in os.walk(self.root):
            rel = self._rel(Path(here))
            entries: Dict[str, Entry] = {d: ("d", None) for d in subdirs}
            for name in files:
                full = os.path.join(here, name)
                try:
                    st = os.lstat(full)
                    data = b""
                    if not self.opaque(self._rel(Path(full))):
                        with open(full, "rb") as f:
                            data = f.read()
                except FileNotFoundError:  # removed while walking (another thread)
                    continue
                if st.st_ino not in self._ids:
                    self._ids[st.st_ino] = self._next_id
                    self._next_id += 1
                fid = self._ids[st.st_ino]
                seen.add(st.st_ino)
                digest = hashlib.sha1(data).hexdigest()
                self.blobs.setdefault(digest, data)
                contents[fid] = digest
                entries[name] = ("f", fid)
            dirs[rel] = entries
        for ino in [i for i in self._ids if i not in seen]:
            del self._ids[ino]  # gone: the number may come back as another file
        return Tree(dirs, contents)

    # --------------------------------------------------------------- crash images ----
    def marks_before(self, point: int) -> List[Any]:
        return [e.mark for e in self.events[: point + 1] if e.kind == "mark"]

    def build(self, point: int, variant: int, rng: random.Random, out: Path) -> Dict[str, str]:
        """Writes under ``out`` (a new directory) what the root may hold after a power cut
        right after event ``point``; returns {relative file path: blob digest}."""
        now = self.events[point].tree
        dir_sync: Dict[str, Dict[str, Entry]] = dict(self._baseline.dirs)
        file_sync: Dict[int, Tuple[int, str]] = {fid: (0, d) for fid, d in self._baseline.contents.items()}
        for i, e in enumerate(self.events[: point + 1]):
            if e.synced_dir is not None:
                dir_sync[e.synced_dir] = e.tree.dirs.get(e.synced_dir, {})
            if e.synced_file is not None and e.synced_file in e.tree.contents:
                file_sync[e.synced_file] = (i, e.tree.contents[e.synced_file])
        written: Dict[str, str] = {}
        self._chosen: Dict[int, bytes] = {}  # hard links of one file share its bytes
        out.mkdir(parents=True)
        self._build_dir("", now, dir_sync, file_sync, point, variant, rng, out, written)
        return written

    def _build_dir(self, rel: str, now: Tree, dir_sync, file_sync, point: int, variant: int,
                   rng: random.Random, out: Path, written: Dict[str, str]) -> None:
        durable = dir_sync.get(rel, {})
        current = now.dirs.get(rel, {})
        for name in sorted(set(durable) | set(current)):
            old, new = durable.get(name), current.get(name)
            entry = new if old == new or variant == 1 else old if variant == 0 else rng.choice([old, new])
            if entry is None:
                continue
            path = f"{rel}/{name}" if rel else name
            if entry[0] == "d":
                (out / path).mkdir()
                self._build_dir(path, now, dir_sync, file_sync, point, variant, rng, out, written)
                continue
            if entry[1] not in self._chosen:
                self._chosen[entry[1]] = self._file_bytes(entry[1], now, file_sync, point, variant, rng)
            data = self._chosen[entry[1]]
            (out / path).write_bytes(data)
            written[path] = hashlib.sha1(data).hexdigest()

    def _file_bytes(self, fid: int, now: Tree, file_sync, point: int, variant: int, rng: random.Random) -> bytes:
        since, durable_digest = file_sync.get(fid, (-1, None))
        durable = self.blobs[durable_digest] if durable_digest is not None else b""
        current_digest = now.contents.get(fid)
        if current_digest is None:  # an entry of a file no longer anywhere: its last state
            current_digest = next(e.tree.contents[fid] for e in reversed(self.events[:point + 1])
                                  if fid in e.tree.contents)
        if current_digest == durable_digest or variant == 1:
            return self.blobs[current_digest]
        if variant == 0:
            return durable
        states = [durable] + [self.blobs[d] for d in dict.fromkeys(
            e.tree.contents[fid] for e in self.events[max(since, 0): point + 1] if fid in e.tree.contents)]
        length = len(rng.choice(states))
        out = bytearray()
        for at in range(0, length, PAGE):
            page = rng.choice(states)[at:at + PAGE].ljust(min(PAGE, length - at), b"\0")
            if rng.random() < 0.25:  # torn against the durable bytes
                old = durable[at:at + PAGE].ljust(len(page), b"\0")
                page = b"".join(page[s:s + SECTOR] if rng.random() < 0.5 else old[s:s + SECTOR]
                                for s in range(0, len(page), SECTOR))
            out += page
        return bytes(out)



def check_crash_images(rec: "FsRecorder", check: Callable[[int, Path], Optional[str]], tmp: Path, images: int,
                       seed: int) -> Dict[str, int]:
    """Builds at least ``images`` crash images of ``rec``'s recording (as many variants per
    crash point), checks each with ``check(point, image_dir)`` (None: fine, else what is
    wrong) and fails listing the first failures. The images go to a scratch directory in
    memory (tmpfs) where there is one, since a store's close syncs and a disk's journal
    commit per image would dominate the run; under ``tmp`` otherwise.

    Returns:
        {"images": built, "points": crash points, "failures": images that failed}.
    """
    import shutil
    import tempfile

    shm = Path("/dev/shm")
    scratch = Path(tempfile.mkdtemp(prefix="power-loss-", dir=shm if shm.is_dir() and os.access(shm, os.W_OK)
                                    else tmp))
    try:
        points = len(rec.events)
        per_point = max(2, -(-images // points))
        rng = random.Random(seed)
        failures: List[str] = []
        counts = {"images": 0, "points": points, "failures": 0}
        for point in range(points):
            for variant in range(per_point):
                image = scratch / "image"
                shutil.rmtree(image, ignore_errors=True)
                rec.build(point, variant, rng, image)
                bad = check(point, image)
                counts["images"] += 1
                if bad is not None:
                    counts["failures"] += 1
                    if len(failures) < 8:
                        failures.append(f"crash after event {point} ({rec.events[point].kind}), variant {variant}: {bad}")
        assert not failures, "\n".join(failures)
        return counts
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
