"""Rendezvous for the tests' process groups without racing for a port.

Finding a "free" port by binding port 0, closing the socket and handing the number on is a
race: until the next bind, any process on the machine (another test run, gloo, an outgoing
connection) may take it. Here whoever needs a port binds port 0 itself and says which one
it got, or no port is used at all:

- ``master_store()``: a TCPStore server on a port the OS picks (``store.port`` tells):
  for ``init_process_group(store=...)`` in this process, or as the store other processes
  connect to.
- ``OS_PICKED_PORT``: ``MASTER_PORT`` for a job of one process (env:// rendezvous): its
  rank 0 binds the port, and no peer needs to know the number.
- ``file_init_method(path)``: a ``file://`` rendezvous (a FileStore) for a group of
  processes the test starts; no port at all.

torchrun ``--standalone`` (and torchx's single-node ``dist.ddp``) already binds its store
on ``localhost:0`` and hands the port to its workers.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch.distributed as dist

__all__ = ["OS_PICKED_PORT", "file_init_method", "master_store"]

HOST = "127.0.0.1"
OS_PICKED_PORT = "0"


def master_store(timeout: timedelta = timedelta(seconds=60)) -> dist.TCPStore:
    """A TCPStore server on 127.0.0.1, on the port the OS picks when it binds (``.port``)."""
    return dist.TCPStore(HOST, 0, is_master=True, wait_for_workers=False, timeout=timeout)


def file_init_method(path: str) -> str:
    """``init_method`` of a rendezvous through the file ``path``, which must not exist yet
    (a FileStore is for one group: reusing its file would hand out stale keys)."""
    path = os.path.abspath(path)
    if os.path.exists(path):
        raise ValueError(f"rendezvous file {path} already exists")
    return f"file://{path}"
