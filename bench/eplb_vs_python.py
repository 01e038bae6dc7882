#!/usr/bin/env python3
"""Check `cobalt eplb` against DeepSeek-EPLB's eplb.py: identical outputs, and the speed ratio.

Needs PyTorch and a copy of eplb.py from github.com/deepseek-ai/EPLB (not shipped here):

    python3 bench/eplb_vs_python.py --eplb-py path/to/eplb.py --cobalt build/release/bin/cobalt

Random inputs cover both policies (hierarchical when groups % nodes == 0, else global) and, for
half of the cases, loads with many exact ties. Each case runs eplb.rebalance_experts and
`cobalt eplb` and compares phy2log, log2phy and logcnt. The timing part runs rebalance_experts
in-process; compare it with BM_EPLB_Rebalance of bench/peers_bench.cpp (same shapes).
"""
import argparse
import importlib.util
import json
import random
import subprocess
import sys
import tempfile
import time


def load_eplb(path):
    spec = importlib.util.spec_from_file_location("eplb", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def random_case(rng, trial):
    nodes = rng.randint(1, 4)
    gpus = nodes * rng.randint(1, 4)
    groups = nodes * rng.randint(1, 3) + (1 if trial % 3 == 0 else 0)
    experts = groups * rng.randint(1, 6)
    replicas = gpus * rng.randint(1, 5)
    while replicas < experts:
        replicas += gpus
    layers = rng.randint(1, 3)
    top = 5 if trial % 2 == 0 else 100000  # small range: exact ties everywhere
    weight = [[rng.randint(0, top) for _ in range(experts)] for _ in range(layers)]
    return weight, replicas, groups, nodes, gpus


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--eplb-py", required=True, help="path to DeepSeek-EPLB's eplb.py")
    parser.add_argument("--cobalt", required=True, help="path to the cobalt binary")
    parser.add_argument("--cases", type=int, default=300)
    args = parser.parse_args()
    import torch

    eplb = load_eplb(args.eplb_py)
    rng = random.Random(1)
    mismatches = 0
    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/weights.json"
        for trial in range(args.cases):
            weight, replicas, groups, nodes, gpus = random_case(rng, trial)
            phy2log, log2phy, logcnt = eplb.rebalance_experts(
                torch.tensor(weight), replicas, groups, nodes, gpus)
            with open(path, "w") as f:
                json.dump(weight, f)
            run = subprocess.run(
                [args.cobalt, "eplb", "--weights", path, "--replicas", str(replicas),
                 "--groups", str(groups), "--nodes", str(nodes), "--gpus", str(gpus)],
                capture_output=True, text=True, check=True)
            got = json.loads(run.stdout)
            if (got["phy2log"] != phy2log.tolist() or got["log2phy"] != log2phy.tolist()
                    or got["logcnt"] != logcnt.tolist()):
                mismatches += 1
                print("mismatch:", json.dumps(weight), replicas, groups, nodes, gpus)
    print(f"{args.cases} cases, {mismatches} mismatches")
    for experts, replicas, gpus in [(256, 288, 32), (640, 704, 32), (1024, 1280, 128)]:
        weight = torch.randint(0, 10000, (1, experts))
        start, calls = time.perf_counter(), 0
        while time.perf_counter() - start < 2.0:
            eplb.rebalance_experts(weight, replicas, experts // 8, gpus // 8, gpus)
            calls += 1
        ms = (time.perf_counter() - start) / calls * 1e3
        print(f"eplb.py E={experts} R={replicas} G={gpus}: {ms:.2f} ms per call")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
