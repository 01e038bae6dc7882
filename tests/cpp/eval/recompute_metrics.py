#!/usr/bin/env python3
"""Independent recomputation of `cobalt simulate` metrics from its --dump directory.

Usage: recompute_metrics.py DUMP_DIR REPORT.json

Reads DUMP_DIR/routing.safetensors and DUMP_DIR/<policy>.safetensors with a plain safetensors
parser (struct + json + numpy, no cobalt code), recomputes with numpy, for every policy that ran:
  - validity: every task runs on a rank whose layout slots (at its step and layer) hold its expert;
  - cross-node transfers with node dedup (distinct remote nodes per token) and without dedup,
    summed over the measured steps and all layers, and per step over all layers;
  - imbalance per (step, layer) = max rank load * G / total tasks; mean and max over measured
    (step, layer); per-step mean over layers;
  - MaxVio per (step, layer) = max expert count * E / total tasks - 1, mean over measured;
  - cross_node_bytes = V x token_bytes x 4 exchanges;
and requires exact agreement with REPORT.json (floating-point values summed in the simulator's
order, so they agree bit for bit). Exits 1 listing every mismatch.
"""
import json
import os
import sys

import numpy as np

# The dump reader shared with scripts/cover_tie_effect.py (plain safetensors, no cobalt code).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                                "scripts"))
from dump_files import file_name, read_safetensors  # noqa: E402


def imbalance(counts, num_bins):
    total = int(counts.sum())
    if total == 0:
        return 1.0
    return float(int(counts.max())) * float(num_bins) / float(total)


def check_policy(errors, name, reported, routing, dump, scenario):
    meta, tensors = dump
    ids, src, offsets = routing
    exec_rank, layout = tensors["exec_rank"], tensors["layout"]
    num_layers, num_tokens, top_k = ids.shape
    num_steps = len(offsets) - 1
    num_ranks, num_nodes = int(meta["num_ranks"]), int(meta["num_nodes"])
    num_experts = int(meta["num_experts"])
    per_node = num_ranks // num_nodes
    first = scenario["measured_steps"][0]

    def expect(what, got, want):
        if got != want:
            errors.append(f"{name}: {what}: recomputed {got!r}, reported {want!r}")

    expect("exec_rank shape", tuple(exec_rank.shape), tuple(ids.shape))
    expect("layout shape", tuple(layout.shape[:3]), (num_steps, num_layers, num_ranks))
    src_node = src // per_node
    v_dedup = v_no_dedup = 0
    imb_sum, imb_max, maxvio_sum, bound_sum, measured = 0.0, 1.0, 0.0, 0.0, 0
    step_v = [0] * num_steps
    step_imb_sum = [0.0] * num_steps
    step_imb_layers = [0] * num_steps
    for s in range(num_steps):
        a, b = int(offsets[s]), int(offsets[s + 1])
        for l in range(num_layers):
            e_ids = ids[l, a:b].astype(np.int64)
            ranks = exec_rank[l, a:b].astype(np.int64)
            # Validity: the layout of (s, l) holds each task's expert on its execution rank.
            holds = np.zeros((num_ranks, num_experts), dtype=bool)
            slots = layout[s, l]
            r_idx, _ = np.nonzero(slots >= 0)
            holds[r_idx, slots[slots >= 0]] = True
            if b > a and not holds[ranks, e_ids].all():
                errors.append(f"{name}: step {s} layer {l}: a task runs on a rank without its expert")
            nodes = ranks // per_node
            remote = nodes != src_node[a:b, None]
            no_dedup = int(remote.sum())
            bits = np.zeros(b - a, dtype=np.int64)
            for k in range(top_k):
                bits |= np.where(remote[:, k], np.int64(1) << nodes[:, k], 0)
            dedup = sum(int(((bits >> n) & 1).sum()) for n in range(num_nodes))
            loads = np.bincount(ranks.ravel(), minlength=num_ranks)
            imb = imbalance(loads, num_ranks)
            maxvio = imbalance(np.bincount(e_ids.ravel(), minlength=num_experts), num_experts) - 1.0
            step_v[s] += dedup
            if b > a:  # imbalance and MaxVio are undefined without tasks
                step_imb_sum[s] += imb
                step_imb_layers[s] += 1
            if s >= first:
                v_dedup += dedup
                v_no_dedup += no_dedup
                if b > a:
                    imb_sum += imb
                    imb_max = max(imb_max, imb)
                    maxvio_sum += maxvio
                    # whole-task bound: the busiest rank carries at least ceil(tasks / G)
                    tasks = top_k * (b - a)
                    bound_sum += -(-tasks // num_ranks) * num_ranks / tasks
                    measured += 1
    expect("cross_node_tokens", v_dedup, reported["cross_node_tokens"])
    expect("cross_node_tokens_no_dedup", v_no_dedup, reported["cross_node_tokens_no_dedup"])
    expect("imbalance_mean", imb_sum / measured if measured else 1.0, reported["imbalance_mean"])
    expect("imbalance_max", imb_max, reported["imbalance_max"])
    expect("maxvio_mean", maxvio_sum / measured if measured else 0.0, reported["maxvio_mean"])
    expect("imbalance_bound_mean", bound_sum / measured if measured else 1.0,
           reported["imbalance_bound_mean"])
    expect("step_cross_node_tokens", step_v, reported["step_cross_node_tokens"])
    step_imb = [step_imb_sum[s] / step_imb_layers[s] if step_imb_layers[s] else None
                for s in range(num_steps)]
    expect("step_imbalance", step_imb, reported["step_imbalance"])
    cost = scenario["cost_model"]
    expect("cross_node_bytes", float(v_dedup) * cost["token_bytes"] * cost["exchanges_per_layer"],
           reported["cross_node_bytes"])


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    dump_dir, report_path = sys.argv[1], sys.argv[2]
    with open(report_path) as f:
        report = json.load(f)
    scenario = report["scenario"]
    _, rt = read_safetensors(f"{dump_dir}/routing.safetensors")
    routing = (rt["topk_ids"], rt["source_rank"], rt["step_offsets"])
    errors = []
    if int(routing[2][-1]) != scenario["num_tokens"]:
        errors.append(f"routing: {int(routing[2][-1])} tokens, report says {scenario['num_tokens']}")
    checked = 0
    for reported in report["policies"]:
        if "skipped" in reported:
            continue
        dump = read_safetensors(f"{dump_dir}/{file_name(reported['name'])}")
        check_policy(errors, reported["name"], reported, routing, dump, scenario)
        checked += 1
    if checked == 0:
        errors.append("no policy to check")
    for e in errors:
        print(e, file=sys.stderr)
    if not errors:
        print(f"recomputed {checked} policies: all metrics agree exactly")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
