"""Timing helper shared by bench/'s Python scripts (run as `python3 bench/<script>.py`, which puts
this folder on sys.path)."""
import statistics
import time


def median_ms(fn, repeats):
    """Median wall time of `repeats` calls of fn(), in milliseconds (no warm-up call)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)
