#!/usr/bin/env python3
"""Measures cobalt+ with and without layout pricing (simulate --layout-pricing) on the synthetic
presets at a small and a large number of tokens per step, with synchronous and asynchronous
planning, and prints a Markdown table (docs/cobalt-improvements.md). Times are modelled by the
simulator's cost model; planner time is measured on the machine that runs this script.

Usage: scripts/pricing_table.py [path/to/cobalt] [--quick]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

CLI = next((a for a in sys.argv[1:] if not a.startswith("--")), "build/release/bin/cobalt")
QUICK = "--quick" in sys.argv
PRESETS = ["coactivated-late"] if QUICK else ["coactivated-late", "realistic", "skewed"]
TOKENS = [16384, 262144]


def run(preset: str, tokens: int, asynchronous: bool, priced: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "r.json")
        cmd = [CLI, "simulate", "--preset", preset, "--policies", "static,cobalt+",
               "--tokens-per-step", str(tokens), "--warmup-steps", "10", "--json", out]
        if asynchronous:
            cmd.append("--async-planning")
        if priced:
            cmd.append("--layout-pricing")
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        with open(out, encoding="utf-8") as f:
            policies = json.load(f)["policies"]
        result = policies[1]
        # Speedup if planning were free (planner wall time depends on the machine).
        busy = result["sim_step_time_s"] - result["time_breakdown_s"]["planning"]
        result["speedup_without_planning"] = policies[0]["sim_step_time_s"] / busy
        return result


def main() -> None:
    print("| workload | tokens/step | planning | cobalt+ speedup vs static (unpriced -> priced) | "
          "same, planning free | cross-node cut | imbalance | grad sync ms | migration ms | "
          "planning ms |")
    print("|---|---:|---|---|---|---|---|---|---|---|")
    for preset in PRESETS:
        for tokens in TOKENS:
            for asynchronous in (False, True):
                a = run(preset, tokens, asynchronous, False)
                b = run(preset, tokens, asynchronous, True)

                def pair(key: str, fmt: str, scale: float = 1.0) -> str:
                    return f"{a[key] * scale:{fmt}} -> {b[key] * scale:{fmt}}"

                def part(name: str) -> str:
                    return (f"{a['time_breakdown_s'][name] * 1e3:.2f} -> "
                            f"{b['time_breakdown_s'][name] * 1e3:.2f}")

                print(f"| {preset} | {tokens} | {'async' if asynchronous else 'sync'} | "
                      f"{pair('speedup_vs_static', '.2f')} | "
                      f"{pair('speedup_without_planning', '.2f')} | "
                      f"{pair('cross_node_reduction_vs_static', '.1%')} | "
                      f"{pair('imbalance_mean', '.3f')} | {part('grad_sync')} | "
                      f"{part('migration')} | {part('planning')} |", flush=True)


if __name__ == "__main__":
    main()
