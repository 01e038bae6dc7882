#!/usr/bin/env python3
"""Where a policy's layout floor comes from: per measured (step, layer) of a trace, the policy's
imbalance, its layout's floor (cobalt.imbalance_floor: the lowest imbalance any assignment reaches,
tasks free to run on any holder of their expert) and the node-pooled floor (the same with each
node's ranks pooled into one bin of their capacity). A node-pooled floor near 1 with a higher
layout floor means no node is short of replicas: the limit is how few replicas hot experts have
inside nodes (the planner's eps band), not which nodes hold them.

Usage: scripts/floor_breakdown.py TRACE.safetensors NODES RANKS_PER_NODE POLICY [POLICY...]
       [--rho R] [--eps E] [--warmup-steps W]
Prints one line per policy: means over the measured (step, layer). Runs the policies through the
Python bindings (python/cobalt; build first), as `cobalt simulate` does on the same trace when its
sources already number NODES x RANKS_PER_NODE.
"""
import argparse
import collections
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import cobalt  # noqa: E402


def _fits(counts, holder_nodes, num_nodes: int, node_capacity: int) -> bool:
    """Max flow (Edmonds-Karp): experts -> the nodes holding them -> sink (node_capacity each)."""
    num_experts = len(counts)
    source, sink = num_experts + num_nodes, num_experts + num_nodes + 1
    cap = collections.defaultdict(int)
    adj = collections.defaultdict(set)

    def add(u: int, v: int, c: int) -> None:
        cap[(u, v)] += c
        adj[u].add(v)
        adj[v].add(u)

    total = 0
    for e, c in enumerate(counts):
        if c:
            total += int(c)
            add(source, e, int(c))
            for n in holder_nodes[e]:
                add(e, num_experts + n, int(c))
    for n in range(num_nodes):
        add(num_experts + n, sink, node_capacity)
    flow = 0
    while True:
        parent = {source: None}
        queue = collections.deque([source])
        while queue and sink not in parent:
            u = queue.popleft()
            for v in adj[u]:
                if v not in parent and cap[(u, v)] > 0:
                    parent[v] = u
                    queue.append(v)
        if sink not in parent:
            return flow == total
        push, v = 1 << 62, sink
        while parent[v] is not None:
            push = min(push, cap[(parent[v], v)])
            v = parent[v]
        v = sink
        while parent[v] is not None:
            cap[(parent[v], v)] -= push
            cap[(v, parent[v])] += push
            v = parent[v]
        flow += push


def node_pooled_floor(counts: np.ndarray, layout: "cobalt.ExpertLayout",
                      topology: "cobalt.Topology") -> float:
    """The lowest imbalance of any assignment when each node's ranks share one capacity: the
    smallest per-rank bound C such that every task fits with C x ranks_per_node per node, times G
    over the tasks (1.0 without tasks)."""
    total = int(counts.sum())
    if total == 0:
        return 1.0
    per_node = topology.num_ranks // topology.num_nodes
    holder_nodes = [sorted({r // per_node for r in layout.ranks_of(e)})
                    for e in range(layout.num_experts)]
    lower, upper = -(-total // topology.num_ranks), total
    while lower < upper:
        mid = (lower + upper) // 2
        if _fits(counts, holder_nodes, topology.num_nodes, mid * per_node):
            upper = mid
        else:
            lower = mid + 1
    return lower * topology.num_ranks / total


def breakdown(trace: "cobalt.TraceReader", topology: "cobalt.Topology", policy_name: str,
              rho: float, eps: float, warmup_steps: int) -> tuple[float, float, float]:
    """(imbalance, layout floor, node-pooled floor), means over the measured (step, layer)."""
    num_experts, num_ranks = trace.num_experts, topology.num_ranks
    config = cobalt.PolicyConfig(topology, num_experts, trace.top_k, num_layers=trace.num_layers,
                                 slots_per_rank=cobalt.slots_for_rho(num_experts, num_ranks, rho),
                                 eps=eps)
    policy = cobalt.make_policy(policy_name, config)
    offsets = trace.step_offsets
    rows = []
    for step in range(trace.num_steps):
        begin, end = int(offsets[step]), int(offsets[step + 1])
        for layer in range(trace.num_layers):
            ids = np.ascontiguousarray(trace.topk_ids(layer, begin, end))
            src = np.ascontiguousarray(trace.source_rank(begin, end))
            batch = cobalt.RoutingBatch(ids, src, num_experts, num_ranks)
            layout, exec_rank = policy.run(step, layer, batch)
            counts = np.bincount(ids.ravel(), minlength=num_experts).astype(np.int64)
            if step >= warmup_steps and counts.sum() > 0:
                rows.append((cobalt.imbalance(cobalt.rank_loads(exec_rank, num_ranks)),
                             cobalt.imbalance_floor(counts, layout),
                             node_pooled_floor(counts, layout, topology)))
    if not rows:
        raise SystemExit("floor_breakdown: no measured (step, layer) with tasks")
    return tuple(float(x) for x in np.mean(rows, axis=0))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace")
    parser.add_argument("nodes", type=int)
    parser.add_argument("ranks_per_node", type=int)
    parser.add_argument("policies", nargs="+")
    parser.add_argument("--rho", type=float, default=0.5)
    parser.add_argument("--eps", type=float, default=0.15)
    parser.add_argument("--warmup-steps", type=int, default=1)
    args = parser.parse_args()
    trace = cobalt.TraceReader(args.trace)
    topology = cobalt.Topology(args.nodes, args.nodes * args.ranks_per_node)
    if trace.num_sources != topology.num_ranks:
        raise SystemExit(f"floor_breakdown: the trace has {trace.num_sources} source ranks, the "
                         f"cluster {topology.num_ranks}; use a trace made for this cluster")
    for name in args.policies:
        imb, floor, pooled = breakdown(trace, topology, name, args.rho, args.eps,
                                       args.warmup_steps)
        print(f"{name}: imbalance {imb:.3f}, layout floor {floor:.3f}, "
              f"node-pooled floor {pooled:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
