#!/usr/bin/env python3
"""What a kept workspace saves a per-step call from Python, in one run: cobalt+'s balanced
assignment (cobalt.assign_balanced_cover) with a fresh scratch per call against a kept
BalancedCoverWorkspace (and a kept output array), and the dispatch layout
(cobalt.dispatch_layout) into fresh arrays against a kept DispatchLayoutWorkspace. Each pair gives
the same arrays (checked). Median of --repeats calls, one core. On a machine where page faults are
dear (a gVisor sandbox) the fresh calls pay most of their time in them.

    PYTHONPATH=python /usr/bin/python3 bench/python_workspaces.py [--tokens 1048576 --top-k 8
        --experts 256 --nodes 4 --gpus-per-node 8 --repeats 7]
"""
import argparse

import numpy as np

import cobalt
from py_bench_util import median_ms, random_topk_ids


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=1 << 20)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--experts", type=int, default=256)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    ranks = args.nodes * args.gpus_per_node
    if (args.tokens <= 0 or args.repeats <= 0 or not 1 <= args.top_k <= args.experts
            or args.experts % ranks != 0):
        ap.error("--tokens and --repeats must be positive, --top-k in [1, --experts], and "
                 "--experts a multiple of the rank count")
    rng = np.random.default_rng(args.seed)
    topo = cobalt.Topology(args.nodes, ranks)
    per_rank = args.experts // ranks
    # Static EP plus two random replicas per rank.
    lists = []
    for r in range(ranks):
        own = list(range(r * per_rank, (r + 1) * per_rank))
        extra = [int(e) for e in rng.permutation(args.experts) if e not in own][:2]
        lists.append(own + extra)
    layout = cobalt.ExpertLayout.from_rank_lists(topo, args.experts, per_rank + 2, lists)
    ids = random_topk_ids(rng, args.tokens, args.experts, args.top_k).astype(np.int32)
    batch = cobalt.RoutingBatch(ids, None, args.experts, ranks)
    print(f"python_workspaces: {args.tokens} tokens, K={args.top_k}, E={args.experts}, "
          f"{args.nodes}x{args.gpus_per_node} ranks; median of {args.repeats} calls")

    scratch = cobalt.BalancedCoverWorkspace()
    out = np.empty((args.tokens, args.top_k), dtype=np.int32)
    fresh = cobalt.assign_balanced_cover(batch, layout)
    kept = cobalt.assign_balanced_cover(batch, layout, out=out, workspace=scratch)
    assert np.array_equal(fresh, kept)
    rows = {
        "assign_balanced_cover, fresh scratch":
            lambda: cobalt.assign_balanced_cover(batch, layout),
        "assign_balanced_cover, kept workspace + out":
            lambda: cobalt.assign_balanced_cover(batch, layout, out=out, workspace=scratch),
    }
    dispatch_ws = cobalt.DispatchLayoutWorkspace(topo, args.tokens, args.top_k)
    sources = np.asarray(batch.source_rank)
    d_fresh = cobalt.dispatch_layout(fresh, sources, topo)
    d_kept = cobalt.dispatch_layout(fresh, sources, topo, workspace=dispatch_ws)
    assert all(np.array_equal(d_fresh[k], d_kept[k]) for k in d_fresh)
    rows["dispatch_layout, fresh arrays"] = lambda: cobalt.dispatch_layout(fresh, sources, topo)
    rows["dispatch_layout, kept workspace"] = lambda: cobalt.dispatch_layout(
        fresh, sources, topo, workspace=dispatch_ws)
    for name, call in rows.items():
        print(f"  {name:<45} {median_ms(call, args.repeats):8.2f} ms")


if __name__ == "__main__":
    main()
