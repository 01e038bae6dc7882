#!/usr/bin/env python3
"""What each of TopoEP's stages does on a trace: per (step, layer), the solver's stage-(1) replicas,
stage-(3) replicas and refinement moves (cobalt.solve_topoep's stats), the positive-benefit candidates each node has
against its free slots, and the busiest rank of a node over that node's mean load after the solve.

Usage: scripts/topoep_stages.py TRACE.safetensors NODES RANKS_PER_NODE [--slots S]
       [--hidden H] [--ffn F] [--steps I J ...]
Sizes default to GLM-4.5-Air in BF16 (hidden 4096, expert FFN 1408), the cost model's defaults.
The trace's sources must number NODES x RANKS_PER_NODE (as `cobalt trace gen --preset
paper-glm45air-ep32` writes them for 4 x 8). Runs through the Python bindings (python/cobalt;
build first).
"""
import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import cobalt  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("nodes", type=int)
    parser.add_argument("ranks_per_node", type=int)
    parser.add_argument("--slots", type=int, default=0,
                        help="slots per rank (default: cobalt.slots_for_rho(E, G, 0.5), what "
                             "`cobalt simulate --rho 0.5` uses)")
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--ffn", type=int, default=1408)
    parser.add_argument("--steps", type=int, nargs="*", default=None)
    args = parser.parse_args()
    try:
        return run(args)
    except (ValueError, OSError, cobalt.FailedPreconditionError) as error:
        sys.exit(f"topoep_stages: {error}")


def run(args: argparse.Namespace) -> int:
    reader = cobalt.TraceReader(args.trace)
    if args.nodes < 1 or args.ranks_per_node < 1:
        sys.exit("topoep_stages: NODES and RANKS_PER_NODE must be at least 1")
    num_ranks = args.nodes * args.ranks_per_node
    if reader.num_sources != num_ranks:
        sys.exit(f"topoep_stages: the trace has {reader.num_sources} sources, "
                 f"the cluster {num_ranks} ranks (they must be equal)")
    if not reader.has_token_ids:
        sys.exit("topoep_stages: the trace has no token ids (a load-only trace)")
    num_experts = reader.num_experts
    slots = args.slots or cobalt.slots_for_rho(num_experts, num_ranks, 0.5)
    token_bytes = 2.0 * args.hidden
    param_bytes = 3.0 * args.hidden * args.ffn * 2
    topology = cobalt.Topology(args.nodes, num_ranks)
    offsets = np.asarray(reader.step_offsets)
    steps = args.steps if args.steps else list(range(reader.num_steps))
    bad = [step for step in steps if not 0 <= step < reader.num_steps]
    if bad:
        sys.exit(f"topoep_stages: step {bad[0]} out of range [0, {reader.num_steps})")
    fewest_mains = num_experts // num_ranks
    most_mains = -(-num_experts // num_ranks)
    print(f"E={num_experts} K={reader.top_k} cluster {args.nodes}x{args.ranks_per_node} "
          f"slots {slots} (free per rank: {max(0, slots - most_mains)}"
          f"{' or ' + str(max(0, slots - fewest_mains)) if fewest_mains != most_mains else ''})")
    print("step layer  stage1 stage3 moves  candidates/node       busiest/mean per node")
    for step in steps:
        begin, end = int(offsets[step]), int(offsets[step + 1])
        sources = np.asarray(reader.source_rank(begin, end))
        for layer in range(reader.num_layers):
            ids = np.asarray(reader.topk_ids(layer, begin, end))
            demand = np.zeros((num_ranks, num_experts), np.int64)
            np.add.at(demand, (np.repeat(sources, reader.top_k), ids.ravel()), 1)
            plan = cobalt.solve_topoep(demand, topology, slots, token_bytes, param_bytes)
            stats = np.asarray(plan["stats"]).tolist()
            node_demand = demand.reshape(args.nodes, args.ranks_per_node, num_experts).sum(1)
            home = (np.arange(num_experts) * num_ranks // num_experts) // args.ranks_per_node
            candidates = [int(((2 * node_demand[d] * token_bytes - param_bytes > 0)
                               & (home != d)).sum()) for d in range(args.nodes)]
            loads = np.asarray(plan["rank_loads"], float).reshape(args.nodes, args.ranks_per_node)
            busiest = loads.max(1) / np.maximum(loads.mean(1), 1e-12)
            print(f"{step:4d} {layer:5d}  {stats[0]:6d} {stats[1]:6d} {stats[2]:5d}  "
                  f"{str(candidates):20s} "
                  f"{np.round(busiest, 2).tolist()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
