#!/usr/bin/env python3
"""How much of `cobalt`'s imbalance comes from Algorithm 1's tie-break between minimum covers.

Usage: scripts/cover_tie_effect.py DUMP_DIR [POLICY] [--seed N]

Reads a `cobalt simulate --dump DUMP_DIR` (routing.safetensors and POLICY.safetensors, default
`cobalt`; a plain safetensors parser, no cobalt code) and replays Algorithm 1 on the dumped layouts
for every measured (step, layer) three times, in pure Python:
  - "first": among the feasible remote-node masks of the fewest nodes, the first in (popcount,
    value) order, i.e. the lowest node ids (what the library took until session 34), then a
    uniform node per expert within the cover and a uniform replica on that node;
  - "random": the same, but the cover drawn uniformly among all minimum covers (what the library
    does since session 34 with the mask search, i.e. on up to 8 nodes by default);
  - "rotated": the first minimum cover after relabelling the nodes by a random rotation (a cheaper
    rule, measured and not kept).
All keep every token's number of remote nodes, so cross-node transfers are the same. Prints the
share of tokens whose minimum cover is not unique, the mean imbalance (max rank load / mean) under
each rule, the simulator's own imbalance from the dumped exec ranks for comparison, and each
node's share of the tasks under each rule. Python's random module draws the covers, nodes and
replicas, so a rule's column matches the dump's statistics when the dump used that rule, not its
exact ranks. Minutes on large dumps.
"""
import argparse
import random

import numpy as np

from dump_files import file_name, read_safetensors


RULES = ("first", "random", "rotated")


def rotate(mask: int, shift: int, num_nodes: int) -> int:
    """Relabels node n as (n - shift) mod N."""
    full = (1 << num_nodes) - 1
    return ((mask >> shift) | (mask << (num_nodes - shift))) & full


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dump_dir")
    parser.add_argument("policy", nargs="?", default="cobalt")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    meta, routing = read_safetensors(f"{args.dump_dir}/routing.safetensors")
    _, dump = read_safetensors(f"{args.dump_dir}/{file_name(args.policy)}")
    ids, src, offsets = routing["topk_ids"], routing["source_rank"], routing["step_offsets"]
    layouts, exec_rank = dump["layout"], dump["exec_rank"]
    num_layers, _, top_k = ids.shape
    num_nodes, num_ranks = int(meta["num_nodes"]), int(meta["num_ranks"])
    per_node = num_ranks // num_nodes
    first_step = int(meta["first_measured_step"])
    rng = random.Random(args.seed)
    masks_by_size = sorted(range(1 << num_nodes), key=lambda m: (bin(m).count("1"), m))
    sums = {rule: 0.0 for rule in RULES + ("dump",)}
    node_tasks = {rule: [0] * num_nodes for rule in RULES}
    remote_tokens = tied_tokens = measured = 0
    for step in range(first_step, len(offsets) - 1):
        begin, end = int(offsets[step]), int(offsets[step + 1])
        if end == begin:
            continue
        for layer in range(num_layers):
            slots = layouts[step, layer]  # [G, S]
            node_mask = {}
            holders = {}
            for rank in range(num_ranks):
                for e in slots[rank]:
                    if e >= 0:
                        node_mask[int(e)] = node_mask.get(int(e), 0) | (1 << (rank // per_node))
                        holders.setdefault((int(e), rank // per_node), []).append(rank)
            loads = {rule: [0] * num_ranks for rule in RULES}
            for t in range(begin, end):
                src_node = int(src[t]) // per_node
                row = [int(e) for e in ids[layer, t]]
                uncovered = [node_mask[e] for e in row if not (node_mask[e] >> src_node) & 1]
                covers = [0]
                if uncovered:
                    remote_tokens += 1
                    covers, size = [], None
                    for m in masks_by_size:
                        if (m >> src_node) & 1 or (size is not None and bin(m).count("1") > size):
                            continue
                        if all(m & u for u in uncovered):
                            size = bin(m).count("1")
                            covers.append(m)
                    tied_tokens += len(covers) > 1
                for rule in RULES:
                    if rule == "first":
                        cover = covers[0]
                    elif rule == "random":
                        cover = rng.choice(covers)
                    else:
                        shift = rng.randrange(num_nodes)
                        cover = min(covers, key=lambda m: rotate(m, shift, num_nodes))
                    for e in row:
                        if (node_mask[e] >> src_node) & 1:
                            node = src_node
                        else:
                            both = cover & node_mask[e]
                            node = rng.choice([n for n in range(num_nodes) if (both >> n) & 1])
                        loads[rule][rng.choice(holders[(e, node)])] += 1
            mean = top_k * (end - begin) / num_ranks
            for rule in RULES:
                sums[rule] += max(loads[rule]) / mean
                for n in range(num_nodes):
                    node_tasks[rule][n] += sum(loads[rule][n * per_node:(n + 1) * per_node])
            dumped = np.bincount(exec_rank[layer, begin:end].ravel(), minlength=num_ranks)
            sums["dump"] += float(dumped.max()) / mean
            measured += 1
    tied_share = 100.0 * tied_tokens / max(1, remote_tokens)
    print(f"{args.policy}: {measured} measured (step, layer) pairs, {remote_tokens} token-layers "
          f"needing a remote node, {tied_tokens} ({tied_share:.1f}%) with more than one minimum "
          "cover")
    mean_of = {rule: total / max(1, measured) for rule, total in sums.items()}
    print(f"mean imbalance: dump {mean_of['dump']:.3f}, first cover {mean_of['first']:.3f}, "
          f"random among minimum covers {mean_of['random']:.3f}, first after a random rotation "
          f"{mean_of['rotated']:.3f}")
    for rule in RULES:
        total = sum(node_tasks[rule])
        shares = ", ".join(f"{num_nodes * x / total:.2f}" for x in node_tasks[rule])
        print(f"node task share / mean ({rule}): {shares}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
