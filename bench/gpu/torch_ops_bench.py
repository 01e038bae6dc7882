"""What Cobalt's per-step operations cost a PyTorch training step: cobalt.torch.ops on CUDA tensors
(the kernels, through cobalt.cuda) against the same calls on CPU tensors (the C++ references), on
one synthetic batch, with the outputs of both compared element for element.

    python3 bench/gpu/torch_ops_bench.py [--tokens 1048576] [--experts 256] [--top-k 8]
                                         [--nodes 4] [--gpus-per-node 8] [--reps 20]
                                         [--ids-dtype int32|int64]

Rows: assign_tasks (Algorithm 1 on a Cobalt layout of the batch), dispatch_layout (every field),
routing_counts (expert and pair counts), solve_topoep (the batch's demand [G, E]). Columns:
`cuda_ms`, the median over --reps of CUDA events around the call on the current stream (what the
step's stream spends); `call_ms`, the median wall time of the call itself on the host (Python,
checks, launches; the CUDA ops do not wait for the device, except solve_topoep, which reads its
status back); `cpu_ms`, the median of --cpu-reps calls on CPU tensors (one thread); `equal`,
whether the CUDA and CPU outputs are identical. --ids-dtype int64 passes topk_ids and source_rank as
torch.topk returns its indices (the ops narrow them to int32; on CPU in one checked pass). Without a usable device (cobalt.cuda.is_available()
false) only the CPU column is measured.

Exit status: 0, or 1 when an output differs between the devices. Run by bench/gpu/run.sh on the
GPU machine (COBALT_GPU_PYTHON=1); python/tests/test_scripts.py runs it small on CPU.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any, Callable, Optional

import numpy as np
import torch

import cobalt
import cobalt.cuda
from cobalt.torch import ops


def synthetic_batch(num_tokens: int, num_experts: int, top_k: int, num_ranks: int,
                    seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """topk_ids [T, K] int32 (distinct per row, Zipf-like popularity) and source_rank [T] int32
    (contiguous blocks per rank, as in expert parallelism)."""
    gen = torch.Generator().manual_seed(seed)
    bias = -0.8 * torch.log(torch.arange(1, num_experts + 1, dtype=torch.float32))
    bias = bias[torch.randperm(num_experts, generator=gen)]
    chunks = []
    for start in range(0, num_tokens, 65536):
        rows = min(65536, num_tokens - start)
        logits = torch.randn(rows, num_experts, generator=gen) + bias
        chunks.append(torch.topk(logits, top_k, dim=1).indices.to(torch.int32))
    ids = torch.cat(chunks)
    sources = torch.arange(num_tokens, dtype=torch.int64) * num_ranks // num_tokens
    return ids, sources.to(torch.int32)


def cobalt_layout(ids: torch.Tensor, sources: torch.Tensor, topology: cobalt.Topology,
                  num_experts: int, slots_per_rank: int) -> cobalt.ExpertLayout:
    """The layout Cobalt's policy plans from this batch's statistics: in force from its second step
    (the first runs static EP while the plan is made), every slot filled. Planned on the first
    2^16 tokens (enough for the statistics, and quick)."""
    config = cobalt.PolicyConfig(topology, num_experts, ids.shape[1], slots_per_rank=slots_per_rank)
    policy = cobalt.make_policy("cobalt", config)
    head = slice(0, min(len(ids), 1 << 16))
    batch = cobalt.RoutingBatch(ids[head].numpy(), sources[head].numpy(), num_experts,
                                topology.num_ranks)
    policy.run(0, 0, batch)
    layout, _ = policy.run(1, 0, batch)
    return layout


def time_cuda(call: Callable[[], Any], reps: int) -> tuple[float, float, Any]:
    """(median ms between CUDA events around the call, median host ms of the call, last output)
    after two warm-up calls."""
    out = None
    for _ in range(2):
        out = call()
    torch.cuda.synchronize()
    device_ms, host_ms = [], []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = time.perf_counter()
        out = call()
        host_ms.append((time.perf_counter() - t0) * 1e3)
        end.record()
        torch.cuda.synchronize()
        device_ms.append(start.elapsed_time(end))
    return statistics.median(device_ms), statistics.median(host_ms), out


def time_cpu(call: Callable[[], Any], reps: int) -> tuple[float, Any]:
    out = call()  # warm-up (first-touch of the outputs)
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        out = call()
        samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples), out


def same(cuda_out: Any, cpu_out: Any) -> bool:
    """Element-for-element equality of two outputs (tensors, or dataclasses of tensors)."""
    if isinstance(cpu_out, torch.Tensor):
        return bool(torch.equal(cuda_out.cpu(), cpu_out))
    if isinstance(cpu_out, tuple):
        return all(same(a, b) for a, b in zip(cuda_out, cpu_out))
    fields = [k for k, v in vars(cpu_out).items() if v is not None]
    return all(getattr(cuda_out, k) is not None and same(getattr(cuda_out, k), getattr(cpu_out, k))
               for k in fields)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=1 << 20)
    parser.add_argument("--experts", type=int, default=256)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--extra-slots", type=int, default=2,
                        help="replica slots per rank beyond E / G (default 2)")
    parser.add_argument("--reps", type=int, default=20, help="timed CUDA calls per op")
    parser.add_argument("--cpu-reps", type=int, default=3, help="timed CPU calls per op")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ids-dtype", choices=("int32", "int64"), default="int32",
                        help="dtype of topk_ids and source_rank (int64: what torch.topk returns)")
    args = parser.parse_args(argv)
    num_ranks = args.nodes * args.gpus_per_node
    if args.tokens <= 0 or args.reps <= 0 or args.cpu_reps <= 0:
        parser.error("--tokens, --reps and --cpu-reps must be positive")
    if args.experts % num_ranks != 0:
        parser.error(f"--experts ({args.experts}) must be a multiple of the rank count "
                     f"({num_ranks} = {args.nodes} x {args.gpus_per_node})")

    torch.set_num_threads(1)
    topology = cobalt.Topology(args.nodes, num_ranks)
    slots = args.experts // num_ranks + args.extra_slots
    t0 = time.perf_counter()
    ids, sources = synthetic_batch(args.tokens, args.experts, args.top_k, num_ranks, args.seed)
    layout = cobalt_layout(ids, sources, topology, args.experts, slots)
    if args.ids_dtype == "int64":
        ids, sources = ids.long(), sources.long()
    omega = torch.zeros(num_ranks, args.experts, dtype=torch.int64)
    omega.index_put_((sources.long().repeat_interleave(args.top_k), ids.long().flatten()),
                     torch.ones(ids.numel(), dtype=torch.int64), accumulate=True)
    gpu = cobalt.cuda.is_available()
    device = torch.cuda.get_device_name() if gpu else "no usable CUDA device"
    print(f"torch_ops_bench: {args.tokens} tokens ({args.ids_dtype} ids), K={args.top_k}, "
          f"E={args.experts}, "
          f"{args.nodes}x{args.gpus_per_node} ranks, {slots} slots per rank; torch "
          f"{torch.__version__}, {device}; inputs and layout in {time.perf_counter() - t0:.1f} s",
          flush=True)

    ws = cobalt.DispatchLayoutWorkspace(topology, args.tokens, args.top_k)
    exec_cpu = ops.assign_tasks(ids, sources, layout, step=1)
    topo_kw = dict(token_bytes=14336.0, expert_param_bytes=4.2e7)
    cpu_calls: dict[str, Callable[[], Any]] = {
        "assign_tasks": lambda: ops.assign_tasks(ids, sources, layout, step=1),
        "dispatch_layout": lambda: ops.dispatch_layout(exec_cpu, sources, topology, workspace=ws),
        "routing_counts": lambda: ops.routing_counts(ids, args.experts),
        "solve_topoep": lambda: ops.solve_topoep(omega, topology, slots, **topo_kw),
    }
    cuda_calls: dict[str, Callable[[], Any]] = {}
    if gpu:
        ids_d, sources_d, omega_d = ids.cuda(), sources.cuda(), omega.cuda()
        device_layout = cobalt.cuda.DeviceLayout(layout)
        exec_d = ops.assign_tasks(ids_d, sources_d, device_layout, step=1)
        cuda_calls = {
            "assign_tasks": lambda: ops.assign_tasks(ids_d, sources_d, device_layout, step=1),
            "dispatch_layout": lambda: ops.dispatch_layout(exec_d, sources_d, topology),
            "routing_counts": lambda: ops.routing_counts(ids_d, args.experts),
            "solve_topoep": lambda: ops.solve_topoep(omega_d, topology, slots, **topo_kw),
        }

    print(f"{'op':<16} {'cuda_ms':>9} {'call_ms':>9} {'cpu_ms':>9} {'cpu/cuda':>9}  equal")
    mismatches = 0
    for name, cpu_call in cpu_calls.items():
        cpu_ms, cpu_out = time_cpu(cpu_call, args.cpu_reps)
        if name in cuda_calls:
            cuda_ms, call_ms, cuda_out = time_cuda(cuda_calls[name], args.reps)
            equal = same(cuda_out, cpu_out)
            mismatches += not equal
            print(f"{name:<16} {cuda_ms:>9.3f} {call_ms:>9.3f} {cpu_ms:>9.2f} "
                  f"{cpu_ms / cuda_ms:>9.1f}  {'yes' if equal else 'NO'}", flush=True)
        else:
            print(f"{name:<16} {'-':>9} {'-':>9} {cpu_ms:>9.2f} {'-':>9}  -", flush=True)
    if mismatches:
        print(f"torch_ops_bench: {mismatches} op(s) gave different outputs on CUDA and CPU")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
