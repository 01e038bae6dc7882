"""Helpers shared by bench/'s Python scripts (run as `python3 bench/<script>.py`, which puts this
folder on sys.path)."""
import statistics
import time

import numpy as np


def median_ms(fn, repeats):
    """Median wall time of `repeats` calls of fn(), in milliseconds (no warm-up call)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def random_topk_ids(rng, num_tokens, num_experts, top_k):
    """[num_tokens, top_k] int64 expert ids, distinct per row, uniform: the top_k smallest of a
    random key per expert (in chunks of 2^16 tokens, so memory stays small)."""
    chunks = []
    for start in range(0, num_tokens, 1 << 16):
        rows = min(1 << 16, num_tokens - start)
        keys = rng.random((rows, num_experts), dtype=np.float32)
        chunks.append(np.argpartition(keys, top_k - 1, axis=1)[:, :top_k])
    return np.ascontiguousarray(np.concatenate(chunks), dtype=np.int64)
