#!/usr/bin/env python3
"""The PyTorch runtime's exchange plan: the C++ cobalt.exchange_plan against the numpy reference
(cobalt.torch.exchange_plan.build_exchange_plan_reference) on one routing, in one run: equal
plans, and the time of each (median of --repeats calls, one rank's plan, one core).

    PYTHONPATH=python /usr/bin/python3 bench/exchange_plan_vs_numpy.py [--nodes 4 --ranks-per-node 8
        --tokens-per-rank 4096 --top-k 8 --experts 128]

BM_ExchangePlan (bench/core_bench.cpp) times the C++ call alone on the default shape (/1, the
rank-mask path it runs for G <= 64, against /0, the insertion-sort path).
"""
import argparse
import dataclasses

import numpy as np

import cobalt
from py_bench_util import median_ms
from cobalt.torch.exchange_plan import (RoutingGlobal, build_exchange_plan,
                                        build_exchange_plan_reference)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--ranks-per-node", type=int, default=8)
    ap.add_argument("--tokens-per-rank", type=int, default=4096)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rank", type=int, default=5)
    args = ap.parse_args()
    g = args.nodes * args.ranks_per_node
    topo = cobalt.Topology(args.nodes, g)
    slots = cobalt.slots_for_rho(args.experts, g, 0.5)
    layout = cobalt.ExpertLayout.static_ep(topo, args.experts, slots)
    rng = np.random.default_rng(0)
    t = g * args.tokens_per_rank
    ids = np.argsort(rng.random((t, args.experts)), axis=1)[:, :args.top_k].astype(np.int32)
    src = np.repeat(np.arange(g, dtype=np.int32), args.tokens_per_rank)
    exe = np.asarray(cobalt.assign_node_cover(cobalt.RoutingBatch(ids, src, args.experts, g),
                                              layout), dtype=np.int32)
    offsets = np.arange(g + 1, dtype=np.int64) * args.tokens_per_rank
    routing = RoutingGlobal(ids, exe, src, offsets, np.asarray(layout.slots), args.ranks_per_node)
    fast = build_exchange_plan(routing, args.rank)
    ref = build_exchange_plan_reference(routing, args.rank)
    for f in dataclasses.fields(fast):
        a, b = getattr(fast, f.name), getattr(ref, f.name)
        same = (all(np.array_equal(x, y) for x, y in zip(a, b)) and len(a) == len(b)
                if f.name in ("slot_rows", "slot_k") else np.array_equal(a, b)
                if isinstance(a, np.ndarray) else a == b)
        if not same:
            raise SystemExit(f"plans differ in {f.name}")
    cpp_ms = median_ms(lambda: build_exchange_plan(routing, args.rank), args.repeats)
    ref_ms = median_ms(lambda: build_exchange_plan_reference(routing, args.rank), args.repeats)
    print(f"{args.nodes}x{args.ranks_per_node} ranks, {t} tokens, K={args.top_k}, "
          f"E={args.experts}: plans equal; C++ {cpp_ms:.1f} ms, numpy reference {ref_ms:.1f} ms "
          f"({ref_ms / cpp_ms:.1f}x)")


if __name__ == "__main__":
    main()
