"""Full disks (docs/reliability.md): table files or checkpoints on a small tmpfs that fills up.

Each test mounts its own tmpfs (skipped, with the reason, where mount is not permitted):
- an SCM table that does not fit fails at creation with an OSError naming its file (it used
  to be created sparse and die of SIGBUS on the first store to a page the disk had no room for);
- the example's SSD/SCM files on a filesystem that fills up while it trains: exit 1 with an
  OSError naming the table file, the last checkpoint loads and continues bit-identically,
  the block stores reopen;
- the example's checkpoint directory on a filesystem too small for the next checkpoint: exit
  1 naming the checkpoint, ``latest`` still the previous one, which resumes bit-identically.
"""

from __future__ import annotations

import errno
import glob
import os
import re
import signal
import subprocess
import time

import pytest
import torch

from tests.support.crash_helpers import assert_same_tensors, env, metrics, run, train_cmd  # noqa: F401
from tests.support.paths import REPO_ROOT, add_example_to_path

add_example_to_path()
from checkpoint import latest_checkpoint  # noqa: E402


def _mount_tmpfs(path, size: str) -> str:
    os.makedirs(path, exist_ok=True)
    try:
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"mount not possible here: {e}"
    return "" if proc.returncode == 0 else f"mount -t tmpfs refused: {proc.stderr.strip() or proc.returncode}"


@pytest.fixture
def small_fs(tmp_path):
    """A factory of tmpfs mounts of a given size, unmounted at teardown."""
    mounted = []

    def make(name: str, size: str) -> str:
        path = tmp_path / name
        reason = _mount_tmpfs(path, size)
        if reason:
            pytest.skip(reason)
        mounted.append(str(path))
        return str(path)

    yield make
    for path in mounted:
        subprocess.run(["umount", "-l", path], capture_output=True, timeout=30)


def _fill(path: str) -> None:
    """Writes a file until the filesystem of ``path`` is full."""
    chunk = b"\0" * (1 << 16)
    with open(os.path.join(path, "filler"), "wb", buffering=0) as f:
        try:
            while True:
                f.write(chunk)
        except OSError as e:
            assert e.errno == errno.ENOSPC


def test_scm_table_that_does_not_fit_fails_at_creation(small_fs) -> None:
    from torchrec_mtrains.storage import ScmStore

    fs = small_fs("scm", "1M")
    path = os.path.join(fs, "t1_1m.scm")
    with pytest.raises(OSError, match=r"t1_1m\.scm.*No space left") as info:
        ScmStore(path, 20_000, 32, overwrite=True)  # 2.6 MB
    assert info.value.errno == errno.ENOSPC and not os.path.exists(path)
    store = ScmStore(path, 2_000, 32, overwrite=True)  # 0.26 MB: fits, and every row can be written
    assert os.stat(path).st_blocks * 512 >= os.path.getsize(path)  # reserved, not sparse
    store.write(torch.arange(2_000), torch.ones(2_000, 33))
    store.close()
    assert torch.equal(ScmStore.open(path).read(torch.arange(2_000)), torch.ones(2_000, 33))


@pytest.mark.slow
@pytest.mark.multiprocess
def test_tier_files_filling_up_while_training(tmp_path, small_fs) -> None:
    fs = small_fs("tiers", "48M")  # the tables need about 27 MB fully written
    ckpt, steps = str(tmp_path / "ckpt"), ["--steps", "400"]
    # The run stops itself once its first checkpoint is complete; the disk fills up then.
    # (stderr to a file: a full pipe would block the run before it gets there.)
    err_path = tmp_path / "stderr.txt"
    with open(err_path, "w") as err:
        proc = subprocess.Popen(train_cmd(fs, ckpt, str(tmp_path / "out"), *steps), cwd=REPO_ROOT,
                                env=env("checkpoint.cleanup:1", MTRAINS_FAULT_SIGNAL="SIGSTOP"),
                                stdout=subprocess.DEVNULL, stderr=err)
    stopped = os.waitid(os.P_PID, proc.pid, os.WSTOPPED | os.WEXITED | os.WNOWAIT)
    try:
        assert stopped.si_code == os.CLD_STOPPED, f"the run ended before its first checkpoint:\n{err_path.read_text()[-3000:]}"
        assert latest_checkpoint(ckpt) is not None
        _fill(fs)
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    proc.wait(timeout=120)
    stderr = err_path.read_text()
    assert proc.returncode == 1, stderr[-3000:]
    error = [line for line in stderr.splitlines() if line.startswith("train.py: error")]
    assert error and "[Errno 28]" in error[0] and "No space left on device" in error[0], stderr[-3000:]
    # The table (shard), its tier and its file.
    assert re.search(rf"table (t\w+)\.r0\.c0 on SSD: {re.escape(fs)}/rank_0/\1\.r0\.c0\.blk", error[0]), error[0]
    assert "Traceback" not in stderr

    # The block stores reopen (what they accepted before the failure is readable).
    from torchrec_mtrains.storage import BlockStore

    blk = glob.glob(os.path.join(fs, "rank_0", "*.blk"))
    assert blk
    for path in blk:
        with BlockStore.open(path) as store:
            assert store.read(torch.arange(100)).isfinite().all()
    os.remove(os.path.join(fs, "filler"))

    # The last checkpoint is intact: resumed (tables elsewhere), the run equals an uninterrupted one.
    last = latest_checkpoint(ckpt)
    assert last is not None
    short = ["--steps", "20"]
    ref = run(train_cmd(str(tmp_path / "st_ref"), str(tmp_path / "ck_ref"), str(tmp_path / "ref"), *short), env())
    res = run(train_cmd(str(tmp_path / "st2"), ckpt, str(tmp_path / "resumed"), *short, "--resume"), env())
    assert ref.returncode == 0 and res.returncode == 0, res.stderr[-3000:]
    got = metrics(str(tmp_path / "resumed"))
    if got["resumed_from"] < 20:
        assert got["losses"] == metrics(str(tmp_path / "ref"))["losses"]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_checkpoint_dir_filling_up(tmp_path, small_fs) -> None:
    # Each full step of this model is about 7 MB (mostly the FUSED tables, whole in the dense
    # state; a delta holds their changed rows): every save full, the first fits, the second
    # does not.
    fs = small_fs("ckpt", "10M")
    ckpt = os.path.join(fs, "ckpt")
    proc = run(train_cmd(str(tmp_path / "st"), ckpt, str(tmp_path / "out"), "--full-every", "1"), env())
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    error = [line for line in proc.stderr.splitlines() if line.startswith("train.py: error")]
    assert error and "[Errno 28]" in error[0] and f"checkpoint {ckpt}/step_00000008 could not be written (No space left on device)" in error[0]
    assert f"still {ckpt}/step_00000004" in error[0]
    assert latest_checkpoint(ckpt) == f"{ckpt}/step_00000004"
    assert sorted(os.listdir(ckpt)) == ["latest", "step_00000004"]  # the partial one was removed

    # The previous checkpoint loads and continues bit-identically (no more saves).
    ref = run(train_cmd(str(tmp_path / "st_ref"), str(tmp_path / "ck_ref"), str(tmp_path / "ref")), env())
    res = run(train_cmd(str(tmp_path / "st2"), ckpt, str(tmp_path / "resumed"), "--resume",
                        "--checkpoint-every", "0"), env())
    assert ref.returncode == 0 and res.returncode == 0, res.stderr[-3000:]
    assert metrics(str(tmp_path / "resumed"))["resumed_from"] == 4
    assert metrics(str(tmp_path / "resumed"))["losses"] == metrics(str(tmp_path / "ref"))["losses"]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_tier_files_filling_up_under_a_two_rank_torchrun_job(tmp_path, small_fs) -> None:
    """The disk fills under a 2-rank job: the rank that hits it exits 1 naming the table and
    file, torchrun ends its peer (no hang in a collective), and the last checkpoint loads."""
    from tests.support.crash_helpers import torchrun_cmd, torchrun_env

    fs = small_fs("tiers2", "64M")
    ckpt = str(tmp_path / "ckpt")
    cmd = torchrun_cmd(fs, ckpt, str(tmp_path / "out"), "--steps", "400", max_restarts=0)
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=torchrun_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        deadline = time.time() + 180
        while latest_checkpoint(ckpt) is None and proc.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        if latest_checkpoint(ckpt) is None:
            proc.kill()
            pytest.fail(f"no checkpoint was taken:\n{proc.communicate()[1][-3000:]}")
        _fill(fs)
        stderr = proc.communicate(timeout=180)[1]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0, stderr[-3000:]
    error = [line for line in stderr.splitlines() if line.startswith("train.py: error")]
    assert error, "\n".join(line for line in stderr.splitlines() if "train.py" in line or "Errno" in line)[-3000:]
    m = re.search(r"\(rank (\d)\): \[Errno 28\] table (t\w+)\.r\d+\.c\d+ on (SSD|SCM): "
                  rf"{re.escape(fs)}/rank_(\d)/\2\.r\d+\.c\d+\.(blk|scm)", error[0])
    assert m and m.group(1) == m.group(4), error[0]
    os.remove(os.path.join(fs, "filler"))
    last = latest_checkpoint(ckpt)
    assert last is not None and os.path.exists(os.path.join(last, ".metadata"))
