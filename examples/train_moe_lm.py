#!/usr/bin/python3
"""Train a small byte-level MoE language model with expert parallelism across G local processes
(N simulated nodes x M ranks, gloo on 127.0.0.1), once per layout policy, and compare them.

* Data: the real text samples in ../shared/data/text/, one data domain per node (node n reads
  domain n mod 4 of github_oss_with_stack, wikipedia, arxiv, c4), as in pretraining where each
  data-parallel group sees different documents.
* Model: embedding -> 2 x (causal attention + ExpertParallelMoE with SwiGLU experts) -> tied head.
* Policies (default static and cobalt): the same initial weights and the same data; per step the
  loss, the bytes that crossed node boundaries and the rank-load imbalance are printed.
* Checkpoints: --save-state DIR writes each policy's training state at the end
  (cobalt.torch.gather_training_state, built on rank 0 only); --resume-state DIR continues from it,
  also on another number of nodes or ranks (load_training_state; the layout policy's statistics
  start afresh).
* Routing is recorded with cobalt.torch.RoutingRecorder into cobalt-trace v1 files
  (<out>/routing_<policy>.safetensors; `cobalt simulate --trace FILE` replays them) and the
  co-activation (Ochiai, DESIGN.md 3.3) of each window of steps is printed.

Usage (from the repository root, after building the bindings with -DCOBALT_BUILD_PYTHON=ON):
    /usr/bin/python3 examples/train_moe_lm.py [--steps 60] [--policies static,cobalt]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Optional

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for _path in (os.path.join(_ROOT, "python"), os.path.join(_ROOT, "examples")):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import cobalt  # noqa: E402
from cobalt.torch import (  # noqa: E402
    EPGroup,
    ExpertParallelRuntime,
    PolicyLayoutSource,
    RoutingRecorder,
    allreduce_gradients,
    gather_training_state,
    launch,
    load_training_state,
)
from moe_lm.data import DOMAINS, DomainStream, default_data_dir  # noqa: E402
from moe_lm.model import TinyMoELM  # noqa: E402

TOKEN_CHANNELS = ["dispatch.fwd", "combine.fwd", "dispatch.bwd", "combine.bwd"]
OTHER_CHANNELS = ["dispatch_gates.fwd", "dispatch_gates.bwd", "replica_params.fwd",
                  "replica_grads.bwd", "migration", "routing.fwd"]


@dataclass
class Config:
    nodes: int = 2
    ranks_per_node: int = 4
    policies: list[str] = field(default_factory=lambda: ["static", "cobalt"])
    steps: int = 60
    layers: int = 2
    d_model: int = 64
    heads: int = 4
    ffn: int = 128
    num_experts: int = 16
    top_k: int = 2
    seq_len: int = 64
    batch: int = 4
    lr: float = 3e-3
    rho: float = 0.5
    relayout_period: int = 10
    seed: int = 0
    window: int = 10
    data_dir: str = ""
    out_dir: str = ""
    domains: list[str] = field(default_factory=lambda: list(DOMAINS))
    save_state: str = ""
    resume_state: str = ""


def state_path(directory: str, policy: str) -> str:
    return os.path.join(directory, f"state_{policy}.pt")


def run_policy(cfg: Config, ep: EPGroup, policy: str, stream: DomainStream) -> dict[str, object]:
    """Trains from the same initial state with `policy`; returns per-step metrics (rank 0's view
    of global values)."""
    torch.manual_seed(cfg.seed)  # identical dense initialisation on every rank and in every run
    slots = cobalt.slots_for_rho(cfg.num_experts, ep.world_size, cfg.rho)
    source = PolicyLayoutSource(policy, ep.topology, cfg.num_experts, cfg.top_k,
                                num_layers=cfg.layers, slots_per_rank=slots, hidden=cfg.d_model,
                                ffn=cfg.ffn, seed=cfg.seed,
                                steps_per_global_plan=cfg.relayout_period, async_planning=True)
    rt = ExpertParallelRuntime(ep, source)
    model = TinyMoELM(rt, layers=cfg.layers, d_model=cfg.d_model, heads=cfg.heads, ffn=cfg.ffn,
                      num_experts=cfg.num_experts, top_k=cfg.top_k, seq_len=cfg.seq_len,
                      seed=cfg.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    rt.attach_optimizer(opt)
    if cfg.resume_state:  # read by rank 0, which sends every rank its experts
        path = state_path(cfg.resume_state, policy)
        load_training_state(model, torch.load(path) if ep.rank == 0 else None, opt, src=0)
    first_step = rt.step
    domains = [cfg.domains[n % len(cfg.domains)] for n in range(ep.num_nodes)]
    recorder = RoutingRecorder(cfg.num_experts, cfg.top_k, ep=ep, metadata={
        "model": f"tiny-moe-lm-{cfg.layers}x{cfg.d_model}-E{cfg.num_experts}-K{cfg.top_k}",
        "dataset": "olmoe text samples, node domains " + ",".join(domains),
        "policy": policy, "notes": "examples/train_moe_lm.py"})
    for layer, moe in enumerate(model.moes):
        recorder.attach(moe.router, layer)  # type: ignore[arg-type]

    history: dict[str, list[float]] = {k: [] for k in (
        "loss", "cross_node_token_bytes", "intra_node_token_bytes", "other_cross_node_bytes",
        "imbalance", "cross_node_tokens", "version")}
    start = time.time()
    for step in range(first_step, first_step + cfg.steps):
        rt.traffic.reset()
        x, y = stream.batch(step)
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, 256), y.reshape(-1))
        (loss / ep.world_size).backward()  # summed over ranks: the gradient of the mean loss
        allreduce_gradients(model.dense_parameters(), ep.group)
        opt.step()
        opt.zero_grad(set_to_none=True)
        recorder.end_step()
        totals = rt.traffic.global_totals(ep.group, TOKEN_CHANNELS + OTHER_CHANNELS)
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss, group=ep.group)
        records = [r for r in rt.records if r.step == step]
        history["loss"].append(mean_loss.item() / ep.world_size)
        history["cross_node_token_bytes"].append(sum(totals[c].cross_bytes for c in TOKEN_CHANNELS))
        history["intra_node_token_bytes"].append(sum(totals[c].intra_bytes for c in TOKEN_CHANNELS))
        history["other_cross_node_bytes"].append(sum(totals[c].cross_bytes for c in OTHER_CHANNELS))
        history["imbalance"].append(float(np.mean([r.imbalance for r in records])))
        history["cross_node_tokens"].append(sum(r.cross_node_tokens for r in records))
        history["version"].append(max(moe.experts.version for moe in model.moes))
        rt.end_step()
        if ep.rank == 0 and (step % 10 == 0 or step == first_step + cfg.steps - 1):
            print(f"[{policy:>8}] step {step:3d}  loss {history['loss'][-1]:.3f}  cross-node "
                  f"token MB {history['cross_node_token_bytes'][-1] / 1e6:6.3f}  imbalance "
                  f"{history['imbalance'][-1]:.3f}  layout v{int(history['version'][-1])}",
                  flush=True)
    wall = time.time() - start
    if cfg.save_state:
        state = gather_training_state(model, opt, dst=0)  # None on the other ranks
        if state is not None:
            path = state_path(cfg.save_state, policy)
            torch.save(state, path + ".tmp")
            os.replace(path + ".tmp", path)
    trace = os.path.join(cfg.out_dir, f"routing_{policy}.safetensors")
    recorder.write(trace)
    counters = [vars(moe.experts.counters).copy() for moe in model.moes]
    return {"policy": policy, "first_step": first_step, "history": history, "wall_s": wall,
            "trace": trace,
            "migration": counters, "slots_per_rank": slots, "domains": domains}


def worker(rank: int, world: int, cfg: Config) -> None:
    ep = EPGroup.create(cfg.ranks_per_node)
    domain = cfg.domains[ep.node % len(cfg.domains)]
    stream = DomainStream(cfg.data_dir, domain, rank, cfg.batch, cfg.seq_len, cfg.seed)
    results = [run_policy(cfg, ep, policy, stream) for policy in cfg.policies]
    if rank == 0:
        with open(os.path.join(cfg.out_dir, "results.json"), "w") as f:
            json.dump({"config": asdict(cfg), "runs": results}, f, indent=1)


# ------------------------------------------------------------------------------ reporting
def ochiai_windows(path: str, window: int) -> list[tuple[int, int, list[cobalt.OchiaiSummary]]]:
    """(first step, end step, per-layer Ochiai summary) for each window of steps of a trace."""
    reader = cobalt.TraceReader(path)
    offsets = reader.step_offsets
    out = []
    for first in range(0, reader.num_steps, window):
        end = min(first + window, reader.num_steps)
        begin_t, end_t = int(offsets[first]), int(offsets[end])
        per_layer = []
        for layer in range(reader.num_layers):
            stats = cobalt.RoutingStats.exact_counts(reader.num_experts)
            ids = reader.topk_ids(layer, begin_t, end_t)
            stats.update(cobalt.RoutingBatch(ids, None, reader.num_experts, 1))
            per_layer.append(stats.ochiai_summary())
        out.append((first, end, per_layer))
    return out


def report(cfg: Config) -> None:
    with open(os.path.join(cfg.out_dir, "results.json")) as f:
        runs = json.load(f)["runs"]
    base = runs[0]["history"]
    print("\nPer policy: means over all steps of the bytes all ranks sent per training step "
          "(forward + backward), and of max/mean tasks per rank:")
    print(f"{'policy':>8} | {'loss (last 10)':>14} | {'x-node token MB':>15} | "
          f"{'vs ' + runs[0]['policy']:>10} | {'x-node replica+migr MB':>22} | "
          f"{'x-node total MB':>15} | {'in-node token MB':>16} | {'imbalance':>9} | "
          f"{'versions':>8} | {'main moves x/in':>15} | {'wall s':>6}")
    for run in runs:
        h = run["history"]
        cross = float(np.mean(h["cross_node_token_bytes"]))
        other = float(np.mean(h["other_cross_node_bytes"]))
        base_cross = float(np.mean(base["cross_node_token_bytes"]))
        reduction = 1.0 - cross / base_cross if base_cross > 0 else 0.0  # one node: none
        moves = run["migration"]
        mx = sum(c["main_moves_cross_node"] for c in moves)
        mi = sum(c["main_moves_intra_node"] for c in moves)
        print(f"{run['policy']:>8} | {np.mean(h['loss'][-10:]):14.4f} | {cross / 1e6:15.3f} | "
              f"{reduction * 100:9.1f}% | {other / 1e6:22.3f} | {(cross + other) / 1e6:15.3f} | "
              f"{np.mean(h['intra_node_token_bytes']) / 1e6:16.3f} | "
              f"{np.mean(h['imbalance']):9.3f} | {int(h['version'][-1]):8d} | "
              f"{f'{mx}/{mi}':>15} | {run['wall_s']:6.1f}")
    print("(x-node token MB: hidden states of dispatch + combine; replica+migr: replica parameter "
          "copies and gradients, main-instance moves with optimizer state, gate weights, routing "
          "ids)")
    trace = runs[0]["trace"]
    print(f"\nCo-activation of the recorded routing ({runs[0]['policy']} run; Ochiai count-weighted "
          f"/ top-partner per layer, windows of {cfg.window} steps):")
    for first, end, per_layer in ochiai_windows(trace, cfg.window):
        cells = "  ".join(f"L{i}: {s.count_weighted:.3f} / {s.top_partner:.3f}"
                          for i, s in enumerate(per_layer))
        print(f"  steps {first:3d}-{end - 1:3d}  {cells}")
    options = cobalt.TraceStatsOptions(num_ranks=cfg.nodes * cfg.ranks_per_node)
    stats = cobalt.compute_trace_stats(cobalt.TraceReader(trace), options)

    def optional(value: Optional[float]) -> str:  # None: not defined (churn needs two steps)
        return "n/a" if value is None else f"{value:.3f}"

    print(f"Whole trace: load max/mean {stats.load_max_mean:.2f}, source locality "
          f"{optional(stats.source_locality)} (0 = none), hot-set churn "
          f"{optional(stats.hot_set_churn)}")
    print("\nReplay the recorded traces in the simulator (replaying a run's own trace, its "
          "policy's cross-node tokens and imbalance equal the runtime's):")
    for run in runs:
        print(f"  build/release/bin/cobalt simulate --trace {os.path.relpath(run['trace'])} "
              f"--cluster {cfg.nodes}x{cfg.ranks_per_node} --warmup-steps 0 --async-planning "
              f"--seed {cfg.seed} --policies {','.join(cfg.policies)}")


def parse_args() -> Config:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    d = Config()
    p.add_argument("--nodes", type=int, default=d.nodes)
    p.add_argument("--ranks-per-node", type=int, default=d.ranks_per_node)
    p.add_argument("--policies", default=",".join(d.policies),
                   help=f"comma-separated, from {cobalt.policy_names()}; the first is the baseline")
    p.add_argument("--steps", type=int, default=d.steps)
    p.add_argument("--num-experts", type=int, default=d.num_experts)
    p.add_argument("--top-k", type=int, default=d.top_k)
    p.add_argument("--layers", type=int, default=d.layers)
    p.add_argument("--d-model", type=int, default=d.d_model)
    p.add_argument("--ffn", type=int, default=d.ffn)
    p.add_argument("--seq-len", type=int, default=d.seq_len)
    p.add_argument("--batch", type=int, default=d.batch, help="sequences per rank per step")
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--rho", type=float, default=d.rho)
    p.add_argument("--relayout-period", type=int, default=d.relayout_period)
    p.add_argument("--window", type=int, default=d.window, help="steps per Ochiai window")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--domains", default=",".join(d.domains),
                   help="node n reads domain n mod len(domains)")
    p.add_argument("--data-dir", default=default_data_dir())
    p.add_argument("--out-dir", default=os.path.join(_ROOT, "out", "train_moe_lm"))
    p.add_argument("--save-state", default="", metavar="DIR",
                   help="write each policy's training state to DIR/state_<policy>.pt at the end")
    p.add_argument("--resume-state", default="", metavar="DIR",
                   help="start each policy from DIR/state_<policy>.pt (any node shape)")
    a = p.parse_args()
    unknown = [x for x in a.policies.split(",") if x not in cobalt.policy_names()]
    if unknown:
        p.error(f"unknown policies {unknown} (valid: {', '.join(cobalt.policy_names())})")
    if a.save_state and not os.path.isdir(a.save_state):
        p.error(f"--save-state {a.save_state}: not a directory")
    missing = [state_path(a.resume_state, x) for x in a.policies.split(",")
               if a.resume_state and not os.path.isfile(state_path(a.resume_state, x))]
    if missing:
        p.error(f"--resume-state: no saved state {missing}")
    return Config(nodes=a.nodes, ranks_per_node=a.ranks_per_node, policies=a.policies.split(","),
                  steps=a.steps, layers=a.layers, d_model=a.d_model, ffn=a.ffn,
                  num_experts=a.num_experts, top_k=a.top_k, seq_len=a.seq_len, batch=a.batch,
                  lr=a.lr, rho=a.rho, relayout_period=a.relayout_period, seed=a.seed,
                  window=a.window, data_dir=a.data_dir, out_dir=a.out_dir,
                  domains=a.domains.split(","), save_state=a.save_state,
                  resume_state=a.resume_state)


def main() -> None:
    cfg = parse_args()
    os.makedirs(cfg.out_dir, exist_ok=True)
    world = cfg.nodes * cfg.ranks_per_node
    print(f"{world} processes ({cfg.nodes} nodes x {cfg.ranks_per_node}), policies "
          f"{cfg.policies}, {cfg.steps} steps, node domains "
          f"{[cfg.domains[n % len(cfg.domains)] for n in range(cfg.nodes)]}", flush=True)
    start = time.time()
    launch(worker, world, (cfg,), timeout_s=3600, collective_timeout_s=300)
    print(f"training done in {time.time() - start:.0f} s", flush=True)
    report(cfg)


if __name__ == "__main__":
    main()
