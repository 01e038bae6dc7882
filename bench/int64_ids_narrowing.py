#!/usr/bin/env python3
"""int64 routing ids (what torch.topk returns) into a cobalt.RoutingBatch, in one run: the
bindings' one checked narrowing pass (RoutingBatch(int64 arrays)) against the route the CPU ops
took before it (numpy min and max for the int32 range check, a cast to int32, then the batch's own
copy of the int32 arrays), and against int32 inputs (the batch's copy alone). Every route builds
and validates the same batch; the script checks that the arrays are equal. Median of --repeats
calls, one core.

    PYTHONPATH=python /usr/bin/python3 bench/int64_ids_narrowing.py [--tokens 1048576 --top-k 8
        --experts 256 --ranks 32 --repeats 9]
"""
import argparse

import numpy as np

import cobalt
from py_bench_util import median_ms, random_topk_ids


def checked_cast_then_batch(ids, sources, num_experts, num_ranks):
    """The route before the one-pass narrowing (cobalt.torch.ops' old _int32_numpy)."""
    arrays = []
    for a in (ids, sources):
        lo, hi = int(a.min()), int(a.max())
        if lo < np.iinfo(np.int32).min or hi > np.iinfo(np.int32).max:
            raise ValueError("outside int32")
        arrays.append(np.ascontiguousarray(a, dtype=np.int32))
    return cobalt.RoutingBatch(arrays[0], arrays[1], num_experts, num_ranks)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=1 << 20)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--experts", type=int, default=256)
    ap.add_argument("--ranks", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.tokens <= 0 or args.repeats <= 0 or not 1 <= args.top_k <= args.experts:
        ap.error("--tokens and --repeats must be positive and --top-k in [1, --experts]")
    rng = np.random.default_rng(args.seed)
    ids64 = random_topk_ids(rng, args.tokens, args.experts, args.top_k)
    sources64 = np.arange(args.tokens, dtype=np.int64) * args.ranks // args.tokens
    ids32, sources32 = ids64.astype(np.int32), sources64.astype(np.int32)
    routes = {
        "int64, one checked pass (now)":
            lambda: cobalt.RoutingBatch(ids64, sources64, args.experts, args.ranks),
        "int64, range check + cast + copy (before)":
            lambda: checked_cast_then_batch(ids64, sources64, args.experts, args.ranks),
        "int32, copy":
            lambda: cobalt.RoutingBatch(ids32, sources32, args.experts, args.ranks),
    }
    reference = routes["int32, copy"]()
    print(f"int64_ids_narrowing: {args.tokens} tokens, K={args.top_k}, E={args.experts}, "
          f"{args.ranks} ranks; median of {args.repeats} calls")
    for name, route in routes.items():
        batch = route()
        assert np.array_equal(batch.topk_ids, reference.topk_ids)
        assert np.array_equal(batch.source_rank, reference.source_rank)
        print(f"  {name:<42} {median_ms(route, args.repeats):8.2f} ms")


if __name__ == "__main__":
    main()
