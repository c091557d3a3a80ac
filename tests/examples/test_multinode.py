"""More than one node: two torchrun agents (2 nodes x 1 rank, c10d rendezvous) train the
example as one node of 2 ranks does -- the same plan, losses, AUC and trained weights --
with each node's table files under its own --storage-dir, and the plan says 2 nodes.

Both jobs run at once (about 40-60 s together on 2 shared cores): a few steps of small tables.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.support.crash_helpers import TRAIN, metrics, run, torchrun_env
from tests.support.planner_nodes import PINNED_PROFILE
from tests.support.ports import HOST, master_store

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

# Tables at 5% of their rows and an 8 MiB DRAM budget: the planner puts one table on SCM
# (rank 0) and one on SSD (rank 1), so both nodes keep files.
SMALL = ["--steps", "4", "--batch-size", "64", "--table-scale", "0.05", "--dram-budget", "8MiB",
         "--eval-batches", "1", "--log-every", "2", "--hardware", PINNED_PROFILE, "--input-time-per-sample", "0s"]
TIMEOUT = 240  # seconds per job; on timeout its whole process group is killed


def _torchrun(*args: str) -> list:
    return [sys.executable, "-m", "torch.distributed.run", "--monitor-interval", "0.5", *args]


def _train_args(storage: str, out: str) -> list:
    return [TRAIN, *SMALL, "--weights-checksum", "--storage-dir", storage, "--out", out]


def _check(proc: subprocess.CompletedProcess, what: str) -> None:
    assert proc.returncode == 0, f"{what} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


def _files(root) -> dict:
    """{rank directory: sorted file names} under a storage root."""
    return {d: sorted(os.listdir(os.path.join(root, d))) for d in sorted(os.listdir(root))}


def test_two_nodes_train_as_one_node_of_two_ranks(tmp_path) -> None:
    store = master_store()  # the rendezvous store: both agents join it as clients, no port to race for
    env = torchrun_env()
    rdzv = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
            f"{HOST}:{store.port}", "--rdzv-id", "two-nodes", "--rdzv-conf", "is_host=0,join_timeout=120"]
    one_node = _torchrun("--standalone", "--nproc-per-node", "2",
                         *_train_args(str(tmp_path / "one_node"), str(tmp_path / "out1")))
    agents = [_torchrun(*rdzv, *_train_args(str(tmp_path / f"node{n}"), str(tmp_path / "out2"))) for n in (0, 1)]
    with ThreadPoolExecutor(3) as pool:
        jobs = [pool.submit(run, cmd, env, TIMEOUT) for cmd in [one_node, *agents]]
        single, *nodes = [j.result() for j in jobs]
    _check(single, "1 node x 2 ranks")
    for n, proc in enumerate(nodes):
        _check(proc, f"agent of node {n}")

    one, two = metrics(str(tmp_path / "out1")), metrics(str(tmp_path / "out2"))
    assert (one["world_size"], one["nodes"], one["ranks_per_node"]) == (2, 1, 2)
    assert (two["world_size"], two["nodes"], two["ranks_per_node"]) == (2, 2, 1)
    plan_line = "".join(p.stdout for p in nodes)
    assert "2 ranks on 2 nodes of 1;" in plan_line and "2 ranks on 1 node of 2;" in single.stdout
    for key in ("placement", "predicted_qps", "predicted_hit_rate", "losses", "auc", "hit_rate", "weights_sha256"):
        assert one[key] == two[key], key
    assert {"SCM", "SSD"} <= set(two["placement"].values()) and len(two["weights_sha256"]) == 64

    # Each node's rank wrote under that node's root only; together the same files as one node.
    single_files = _files(tmp_path / "one_node")
    per_node = [_files(tmp_path / f"node{n}") for n in (0, 1)]
    assert sorted(single_files) == ["rank_0", "rank_1"] and all(len(f) == 1 for f in per_node)
    assert {**per_node[0], **per_node[1]} == single_files
