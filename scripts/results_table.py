#!/usr/bin/env python3
"""Runs `cobalt simulate` on a list of workloads and prints one markdown table per run.

Usage: scripts/results_table.py COBALT_BINARY CLUSTER POLICIES WORKLOAD [WORKLOAD...] [-- extra simulate args]
A WORKLOAD is a preset name or a path to a .safetensors trace.
"""
import json
import os
import subprocess
import sys
import tempfile


def main() -> int:
    argv = sys.argv[1:]
    extra = []
    if "--" in argv:
        idx = argv.index("--")
        argv, extra = argv[:idx], argv[idx + 1 :]
    if len(argv) < 4:
        print(__doc__, file=sys.stderr)
        return 2
    binary, cluster, policies, workloads = argv[0], argv[1], argv[2], argv[3:]
    # layout floor: the lowest mean imbalance any assignment reaches on the policy's layouts.
    # step ms: the cost model's step time (modelled, not measured), planning included; "no
    # planning" without it (what the decisions are worth when the planner keeps up); x static:
    # static's step over this one (> 1 is faster than static).
    print("| workload | cluster | policy | cross-node tokens | vs static | imbalance mean | imbalance max | layout floor | planner ms | step ms (modelled) | no planning | x static |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for workload in workloads:
        source = ["--trace", workload] if workload.endswith(".safetensors") else ["--preset", workload]
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "sim.json")
            cmd = [binary, "simulate", *source, "--cluster", cluster, "--policies", policies, "--json", out, *extra]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            with open(out) as f:
                result = json.load(f)
        name = os.path.basename(workload)
        for p in result["policies"]:
            # null without a static run in --policies (nothing to compare with)
            reduction = p["cross_node_reduction_vs_static"]
            reduction_text = "n/a" if reduction is None else f"{100 * reduction:.1f}%"
            # null on load-only traces (no exchange term) and, for x static, without a static run
            step = p["sim_step_time_s"]
            step_text = "n/a" if step is None else f"{1e3 * step:.2f}"
            no_planning_text = ("n/a" if step is None
                                else f"{1e3 * (step - p['time_breakdown_s']['planning']):.2f}")
            speedup = p["speedup_vs_static"]
            speedup_text = "n/a" if speedup is None else f"{speedup:.2f}"
            print(
                f"| {name} | {cluster} | {p['name']} | {p['cross_node_tokens']} | "
                f"{reduction_text} | {p['imbalance_mean']:.3f} | "
                f"{p['imbalance_max']:.3f} | {p['imbalance_floor_mean']:.3f} | "
                f"{p['planner_wall_ms']:.0f} | {step_text} | {no_planning_text} | {speedup_text} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
