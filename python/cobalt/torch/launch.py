"""Starting G local processes on 127.0.0.1 with gloo (tests, examples): a free port, a process
group timeout so a collective that would hang raises instead, and a join deadline."""

from __future__ import annotations

import datetime
import json
import os
import signal
import socket
import tempfile
import time
import traceback
from typing import Any, Callable, Optional

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


def _record_failure(error_dir: str, rank: int, exc: BaseException) -> None:
    """When and what failed, for launch() to report the rank that failed first: the others then
    fail in their next collective ("Connection closed by peer"), and torch reports whichever
    failure it notices first."""
    record = {"time": time.time(), "summary": f"{type(exc).__name__}: {exc}",
              "traceback": traceback.format_exc()}
    try:
        with open(os.path.join(error_dir, f"rank{rank}.json"), "w") as f:
            json.dump(record, f)
    except OSError:
        pass


def _entry(rank: int, fn: Callable[..., Any], world_size: int, port: int, timeout_s: float,
           args: tuple[Any, ...], error_dir: str) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # all ranks are local: use loopback
    try:
        init_gloo(rank, world_size, port, timeout_s)
    except BaseException as exc:
        _record_failure(error_dir, rank, exc)
        raise
    try:
        fn(rank, world_size, *args)
    except BaseException as exc:
        _record_failure(error_dir, rank, exc)  # before the group's connections close
        raise
    finally:
        dist.destroy_process_group()


def _failures(error_dir: str, world_size: int) -> list[tuple[int, dict[str, Any]]]:
    """(rank, record) of every failure _entry recorded, earliest first."""
    records = []
    for rank in range(world_size):
        try:
            with open(os.path.join(error_dir, f"rank{rank}.json")) as f:
                records.append((rank, json.load(f)))
        except (OSError, ValueError):
            continue  # no failure recorded (or a process killed while writing it)
    return sorted(records, key=lambda r: r[1]["time"])


def _first_failure(processes: list[Any], failures: list[tuple[int, dict[str, Any]]]
                   ) -> Optional[mp.ProcessRaisedException]:
    """The exception launch() raises: a worker that died without a Python exception (a signal
    other than the SIGTERM torch ends the others with, or a non-zero exit code), else the
    earliest recorded failure, with the later ones listed after it."""
    recorded = {rank for rank, _ in failures}
    for rank, process in enumerate(processes):
        code = process.exitcode
        if rank in recorded or code in (0, None, -signal.SIGTERM):
            continue
        how = f"exit code {code}"
        if code < 0:
            try:
                how = f"signal {signal.Signals(-code).name}"
            except ValueError:  # a real-time signal has no name
                how = f"signal {-code}"
        message = (f"rank {rank} died with {how}, without a Python exception (a crash in native "
                   "code, the kernel's OOM killer, os._exit)")
        if failures:
            message += "; then " + "; ".join(
                f"rank {r}: {rec['summary'].splitlines()[0]}" for r, rec in failures)
        return mp.ProcessRaisedException(message, rank, process.pid)
    if not failures:
        return None  # nothing to add to torch's own report
    rank, record = failures[0]
    message = f"rank {rank} failed first:\n\n{record['traceback']}"
    if len(failures) > 1:
        message += "\nthen " + "; ".join(
            f"rank {r}: {rec['summary'].splitlines()[0]}" for r, rec in failures[1:])
    return mp.ProcessRaisedException(message, rank, processes[rank].pid)


def launch(fn: Callable[..., Any], world_size: int, args: tuple[Any, ...] = (), *,
           timeout_s: float = 120.0, collective_timeout_s: float = 60.0) -> None:
    """Runs fn(rank, world_size, *args) in `world_size` spawned processes joined in one gloo
    group. `fn` must be importable (module level). When workers fail, raises
    torch.multiprocessing.ProcessRaisedException naming the rank that failed first: one that
    died without a Python exception (a signal, a non-zero exit code), else the one whose
    exception came first, with its traceback (the others' failures, usually a closed
    connection to it, are listed after it); TimeoutError after `timeout_s` (the workers are
    terminated)."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="cobalt-launch-") as error_dir:
        ctx = mp.start_processes(
            _entry, args=(fn, world_size, port, collective_timeout_s, args, error_dir),
            nprocs=world_size, join=False, start_method="spawn")
        deadline = time.monotonic() + timeout_s
        try:
            while not ctx.join(timeout=max(0.1, min(1.0, deadline - time.monotonic()))):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"launch: {world_size} workers still running after "
                                       f"{timeout_s:.0f} s")
        except (mp.ProcessRaisedException, mp.ProcessExitedException) as exc:
            # torch's join has terminated (SIGTERM) and joined the workers still alive.
            failure = _first_failure(ctx.processes, _failures(error_dir, world_size))
            if failure is None:
                raise
            raise failure from exc
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.terminate()
            for p in ctx.processes:
                p.join(timeout=5)
