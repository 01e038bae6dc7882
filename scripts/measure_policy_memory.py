#!/usr/bin/env python3
"""Where the policies' memory coefficients come from (src/policy/policy_registry.cpp, read by
cobalt::policy::policy_memory and `cobalt simulate`'s up-front memory check).

Writes small token traces (3 steps x 2000 tokens x top-8, 128 source ranks) with E experts and L
layers, replays each policy alone with `cobalt simulate --policies NAME --planner-time-scale 0`
under /usr/bin/time, and fits each policy's peak RSS over `static` on the same run to

    L x (a x E G + b x E^2) + (c x E G + d x E^2)     (bytes; G = ranks)

by least squares over five shapes: (E, G, L) = (4096, 2048, 1), (4096, 2048, 4), (8192, 2048, 1),
(4096, 4096, 1), (4096, 4096, 4). Prints the four coefficients per policy and the fit's largest
relative error. Takes ~3.5 minutes and ~2 GB of memory on the project's 2-core VM.

Usage: scripts/measure_policy_memory.py [--cli build/release/bin/cobalt] [--dir /tmp/x]
       scripts/measure_policy_memory.py --write-trace E L OUT   (one such trace, nothing run)
Needs the Python module (make build-python) to write the traces.
"""
import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import cobalt  # noqa: E402

SHAPES = [(4096, 2048, 1), (4096, 2048, 4), (8192, 2048, 1), (4096, 4096, 1), (4096, 4096, 4)]
RANKS_PER_NODE = 128
TOKENS_PER_STEP, NUM_STEPS, TOP_K, NUM_SOURCES = 2000, 3, 8, 128


def write_trace(path: Path, num_experts: int, num_layers: int) -> None:
    rng = np.random.default_rng(0)
    num_tokens = TOKENS_PER_STEP * NUM_STEPS
    # Distinct experts per token: the TOP_K smallest of random keys, 1000 tokens at a time.
    chunks = []
    for _ in range(num_layers * num_tokens // 1000):
        keys = rng.random((1000, num_experts), dtype=np.float32)
        chunks.append(np.argpartition(keys, TOP_K, axis=1)[:, :TOP_K].astype(np.int32))
    ids = np.concatenate(chunks).reshape(num_layers, num_tokens, TOP_K)
    offsets = np.arange(NUM_STEPS + 1, dtype=np.int64) * TOKENS_PER_STEP
    sources = (np.arange(num_tokens) % NUM_SOURCES).astype(np.int32)
    cobalt.write_trace(str(path), cobalt.TraceData(num_experts, ids, offsets, sources, NUM_SOURCES))


def peak_rss_bytes(cli: str, trace: Path, num_ranks: int, policy: str) -> int:
    cluster = f"{num_ranks // RANKS_PER_NODE}x{RANKS_PER_NODE}"
    run = subprocess.run(["/usr/bin/time", "-f", "%M", cli, "simulate", "--trace", str(trace),
                          "--cluster", cluster, "--policies", policy, "--planner-time-scale", "0"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=True)
    return int(run.stderr.strip().splitlines()[-1]) * 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    root = Path(__file__).resolve().parents[1]
    parser.add_argument("--cli", default=str(root / "build/release/bin/cobalt"))
    parser.add_argument("--dir", default=None, help="where the traces go (default: a temp dir)")
    parser.add_argument("--write-trace", nargs=3, metavar=("E", "L", "OUT"),
                        help="only write one trace of E experts and L layers to OUT")
    args = parser.parse_args()
    if args.write_trace:
        write_trace(Path(args.write_trace[2]), int(args.write_trace[0]), int(args.write_trace[1]))
        return 0
    policies = [p for p in cobalt.policy_names() if p != "static"]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.dir or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        rows, extra = [], {p: [] for p in policies}
        for num_experts, num_ranks, num_layers in SHAPES:
            trace = folder / f"e{num_experts}_l{num_layers}.safetensors"
            if not trace.exists():
                write_trace(trace, num_experts, num_layers)
            base = peak_rss_bytes(args.cli, trace, num_ranks, "static")
            eg, ee = float(num_experts) * num_ranks, float(num_experts) ** 2
            rows.append([num_layers * eg, num_layers * ee, eg, ee])
            for p in policies:
                extra[p].append(peak_rss_bytes(args.cli, trace, num_ranks, p) - base)
            print(f"E={num_experts} G={num_ranks} L={num_layers}: static {base / 2**20:.0f} MiB",
                  file=sys.stderr, flush=True)
    a = np.array(rows)
    print(f"{'policy':10s} {'EG/layer':>9s} {'E^2/layer':>9s} {'EG once':>8s} {'E^2 once':>8s}"
          f" {'max err':>8s}")
    for p in policies:
        y = np.array(extra[p], dtype=float)
        coef = np.linalg.lstsq(a, y, rcond=None)[0]
        err = np.max(np.abs(a @ coef - y) / np.maximum(y, 1.0))
        print(f"{p:10s} {coef[0]:9.2f} {coef[1]:9.2f} {coef[2]:8.2f} {coef[3]:8.2f} {err:8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
