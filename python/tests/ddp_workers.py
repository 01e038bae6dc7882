"""Worker code of test_ddp.py (runs inside spawned gloo processes): a model of an
ExpertParallelMoE followed by a replicated Linear, trained under cobalt.torch.wrap_ddp, and the
same model under plain DistributedDataParallel (refused)."""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import cobalt
from cobalt.torch import (EPGroup, ExpertParallelMoE, ExpertParallelRuntime, PolicyLayoutSource,
                          wrap_ddp)

HIDDEN, FFN, EXPERTS, TOP_K, SEED, STEPS, LR = 8, 12, 8, 2, 5, 4, 0.05


def tokens_of(rank: int, step: int) -> int:
    return (2 + 3 * rank + step) % 7  # uneven, sometimes zero


def batch_of(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7919 * step + rank)
    n = tokens_of(rank, step)
    return torch.randn(n, HIDDEN, generator=g), torch.randn(n, HIDDEN, generator=g)


def head() -> nn.Linear:
    """The replicated layer, identical on every rank and in the reference."""
    torch.manual_seed(11)
    return nn.Linear(HIDDEN, HIDDEN)


class Net(nn.Module):
    """head(x + moe0(x) + moe1(x)): two MoE layers beside each other and a replicated Linear."""

    def __init__(self, moes: list[nn.Module]) -> None:
        super().__init__()
        self.moes = nn.ModuleList(moes)
        self.head = head()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x + self.moes[0](x) + self.moes[1](x))


def worker(rank: int, world: int, ranks_per_node: int, out_dir: str, mode: str) -> None:
    ep = EPGroup.create(ranks_per_node=ranks_per_node)
    slots = cobalt.slots_for_rho(EXPERTS, world, 0.5)
    source = PolicyLayoutSource("cobalt+", ep.topology, EXPERTS, TOP_K, num_layers=2,
                                slots_per_rank=slots, hidden=HIDDEN, ffn=FFN, seed=SEED,
                                steps_per_global_plan=2)
    rt = ExpertParallelRuntime(ep, source)
    net = Net([ExpertParallelMoE(rt, layer, HIDDEN, FFN, EXPERTS, TOP_K, seed=SEED)
               for layer in range(2)])
    result: dict[str, Any] = {}
    if mode == "plain":
        model = DistributedDataParallel(net, process_group=ep.group)
        x, _ = batch_of(rank, 0)
        try:
            model(x)
        except ValueError as exc:
            result["error"] = str(exc)
    else:
        model = wrap_ddp(net, ep.group)
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        rt.attach_optimizer(opt)
        for step in range(STEPS):
            x, target = batch_of(rank, step)
            loss = ((model(x) - target) ** 2).sum()
            (loss / world).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            rt.end_step()
        # The layers' own modules and parameters are still theirs after DDP's forwards (a DDP
        # module registered under a layer made model.eval() and state_dict() recurse forever,
        # and the layer's dense parameters the whole model's).
        model.eval()
        result["state_keys"] = len(model.state_dict())
        result["children"] = [[name for name, _ in moe.named_children()] for moe in net.moes]
        result["experts"] = [list(moe.gather_expert_weights()) for moe in net.moes]
        result["router"] = [[p.detach().clone() for p in moe.dense_parameters()]
                            for moe in net.moes]
        result["head"] = [p.detach().clone() for p in net.head.parameters()]
        result["versions"] = [moe.experts.version for moe in net.moes]
    torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
