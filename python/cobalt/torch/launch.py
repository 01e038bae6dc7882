"""Starting G local processes on 127.0.0.1 with gloo (tests, examples): a free port, a process
group timeout so a collective that would hang raises instead, and a join deadline."""

from __future__ import annotations

import datetime
import os
import socket
import time
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

__all__ = ["free_port", "init_gloo", "launch"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def init_gloo(rank: int, world_size: int, port: int, timeout_s: float = 60.0) -> None:
    """init_process_group("gloo") over tcp://127.0.0.1:port; every collective raises after
    `timeout_s` instead of hanging. Also pins torch to one thread per process."""
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout_s))


def _entry(rank: int, fn: Callable[..., Any], world_size: int, port: int, timeout_s: float,
           args: tuple[Any, ...]) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # all ranks are local: use loopback
    init_gloo(rank, world_size, port, timeout_s)
    try:
        fn(rank, world_size, *args)
    finally:
        dist.destroy_process_group()


def launch(fn: Callable[..., Any], world_size: int, args: tuple[Any, ...] = (), *,
           timeout_s: float = 120.0, collective_timeout_s: float = 60.0) -> None:
    """Runs fn(rank, world_size, *args) in `world_size` spawned processes joined in one gloo
    group. `fn` must be importable (module level). Raises the first worker failure
    (torch.multiprocessing.ProcessRaisedException), or TimeoutError after `timeout_s` (the
    workers are terminated)."""
    port = free_port()
    ctx = mp.start_processes(_entry, args=(fn, world_size, port, collective_timeout_s, args),
                             nprocs=world_size, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout_s
    try:
        while not ctx.join(timeout=max(0.1, min(1.0, deadline - time.monotonic()))):
            if time.monotonic() > deadline:
                raise TimeoutError(f"launch: {world_size} workers still running after "
                                   f"{timeout_s:.0f} s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.terminate()
        for p in ctx.processes:
            p.join(timeout=5)
