#!/usr/bin/env python3
"""Writes the hot-block workload of TopoEP's Figure 10 check (docs/peers.md) as a cobalt trace:
E = 640 experts, top-8, 32 source ranks x 4096 tokens per step, experts 0-19 (rank 0's under
static EP) 12x as likely as the others, drawn exactly as tests/cpp/policy/topoep_target_test.cpp's
hot_block_trace() does (SplitMix64 seeded 2024, duplicates in a row redrawn).

Usage: /usr/bin/python3 scripts/hot_block_trace.py STEPS OUT.safetensors
"""

from __future__ import annotations

import sys

import numpy as np

import cobalt

NUM_EXPERTS, TOP_K, NUM_RANKS, TOKENS_PER_RANK = 640, 8, 32, 4096
HOT = NUM_EXPERTS // NUM_RANKS
HOT_WEIGHT = 12.0
TOTAL_WEIGHT = HOT * HOT_WEIGHT + (NUM_EXPERTS - HOT)
GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def splitmix_units(seed: int, count: int) -> np.ndarray:
    """The first `count` values of cobalt::SplitMix64(seed).unit(), vectorised."""
    with np.errstate(over="ignore"):
        z = np.uint64(seed) + np.arange(1, count + 1, dtype=np.uint64) * GOLDEN
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) * 2.0**-53


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    steps, out = int(sys.argv[1]), sys.argv[2]
    if steps < 1:
        print("hot_block_trace: STEPS must be >= 1", file=sys.stderr)
        return 2
    tokens_per_step = NUM_RANKS * TOKENS_PER_RANK
    num_tokens = steps * tokens_per_step
    # Draws in order; rejection of duplicates needs a few more than T x K.
    u = splitmix_units(2024, int(num_tokens * TOP_K * 1.05) + 1024) * TOTAL_WEIGHT
    experts = np.where(u < HOT * HOT_WEIGHT, (u / HOT_WEIGHT).astype(np.int64),
                       (HOT + (u - HOT * HOT_WEIGHT)).astype(np.int64))
    experts = np.minimum(experts, NUM_EXPERTS - 1).tolist()
    ids = np.empty((num_tokens, TOP_K), dtype=np.int32)
    pos = 0
    for t in range(num_tokens):
        row: list[int] = []
        while len(row) < TOP_K:
            e = experts[pos]
            pos += 1
            if e not in row:
                row.append(e)
        ids[t] = row
    offsets = np.arange(steps + 1, dtype=np.int64) * tokens_per_step
    data = cobalt.TraceData(NUM_EXPERTS, ids[None], offsets,
                            metadata={"workload": "topoep-hot-block", "notes": "scripts/hot_block_trace.py"})
    cobalt.write_trace(out, data)
    print(f"wrote {out}: {num_tokens} tokens, {steps} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
