#!/usr/bin/env python3
"""One training step of one cobalt.torch.ExpertParallelMoE layer in one process (gloo, world size
1), against the same experts as a plain loop (per expert: gather its tokens, SwiGLU, gate,
index_add): what the runtime adds around the matmuls. Median of --repeats steps after 3 untimed
ones; forward and backward (input gradient included) and, for the layer, Adam's step and
end_step. Both run the same matmuls.

    /usr/bin/python3 bench/runtime_step.py [--policy cobalt+ --tokens 4096 --hidden 256
        --ffn 512 --experts 32 --top-k 2 --repeats 5]
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "python"))
import cobalt  # noqa: E402
from cobalt.torch import (EPGroup, ExpertParallelMoE, ExpertParallelRuntime,  # noqa: E402
                          PolicyLayoutSource)
from py_bench_util import median_ms  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", default="cobalt+")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--ffn", type=int, default=512)
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--port", type=int, default=29561)
    a = ap.parse_args()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(a.port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    h, f, e, k = a.hidden, a.ffn, a.experts, a.top_k
    ep = EPGroup.create(ranks_per_node=1)
    slots = cobalt.slots_for_rho(e, 1, 0.5)
    source = PolicyLayoutSource(a.policy, ep.topology, e, k, num_layers=1, slots_per_rank=slots,
                                steps_per_global_plan=10)
    rt = ExpertParallelRuntime(ep, source)
    moe = ExpertParallelMoE(rt, 0, h, f, e, k)
    opt = torch.optim.Adam(moe.parameters(), lr=1e-3)
    rt.attach_optimizer(opt)
    # The layer's input requires grad, as inside a model (its gradient is computed either way).
    x = torch.randn(a.tokens, h, generator=torch.Generator().manual_seed(0)).requires_grad_()

    def layer_step():
        moe(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        rt.end_step()

    w1, w3, w2 = (t.detach().clone().requires_grad_() for t in moe.gather_expert_weights())
    router = moe.router

    def plain_step():
        ids, gates = router(x)
        out = torch.zeros_like(x)
        for expert in range(e):
            rows, slot = (ids == expert).nonzero(as_tuple=True)
            xe = x[rows]
            y = (torch.nn.functional.silu(xe @ w1[expert]) * (xe @ w3[expert])) @ w2[expert]
            out = out.index_add(0, rows, y * gates[rows, slot, None])
        out.pow(2).mean().backward()

    for step in (layer_step, plain_step):
        for _ in range(3):
            step()
    layer, plain = median_ms(layer_step, a.repeats), median_ms(plain_step, a.repeats)
    print(f"{a.policy}, {a.tokens} tokens, H={h}, F={f}, E={e}, top-{k}, {slots} slots, torch "
          f"{torch.__version__}, {torch.get_num_threads()} threads: layer step {layer:.1f} ms, "
          f"plain loop {plain:.1f} ms ({layer / plain:.2f}x)")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
