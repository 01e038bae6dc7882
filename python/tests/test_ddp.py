"""cobalt.torch.wrap_ddp: DistributedDataParallel around a model with an ExpertParallelMoE trains
exactly like the one-process reference (2 nodes x 2 ranks, gloo, layouts changing under
cobalt+), and plain DistributedDataParallel(model), which would overwrite every rank's experts
with rank 0's, is refused on every rank."""

from __future__ import annotations

import os

import pytest
import torch

from cobalt.torch import ReferenceMoE, launch

import ddp_workers as dw

WORLD, RANKS_PER_NODE = 4, 2


def run(tmp_path, mode: str) -> list[dict]:
    launch(dw.worker, WORLD, (RANKS_PER_NODE, str(tmp_path), mode), timeout_s=120,
           collective_timeout_s=60)
    return [torch.load(os.path.join(tmp_path, f"rank{r}.pt")) for r in range(WORLD)]


def reference() -> tuple[ReferenceMoE, torch.nn.Linear]:
    moe = ReferenceMoE(dw.HIDDEN, dw.FFN, dw.EXPERTS, dw.TOP_K, seed=dw.SEED)
    head = dw.head()
    opt = torch.optim.SGD(list(moe.parameters()) + list(head.parameters()), lr=dw.LR)
    for step in range(dw.STEPS):
        batches = [dw.batch_of(r, step) for r in range(WORLD)]
        x = torch.cat([b[0] for b in batches])
        target = torch.cat([b[1] for b in batches])
        y = head(x + moe(x, router_chunks=[b[0].shape[0] for b in batches]))
        (((y - target) ** 2).sum() / WORLD).backward()  # the mean of the ranks' losses
        opt.step()
        opt.zero_grad(set_to_none=True)
    return moe, head


def test_wrap_ddp_trains_like_the_reference(tmp_path) -> None:
    ranks = run(tmp_path, "wrapped")
    moe, head = reference()
    assert ranks[0]["versions"] > 1  # the layout changed while training
    for r in range(WORLD):
        for got, want in zip(ranks[r]["experts"], (moe.w1, moe.w3, moe.w2)):
            torch.testing.assert_close(got, want.detach(), rtol=1e-5, atol=1e-5)
        for got, want in zip(ranks[r]["router"], moe.router.parameters()):
            torch.testing.assert_close(got, want.detach(), rtol=1e-5, atol=1e-5)
        for got, want in zip(ranks[r]["head"], head.parameters()):
            torch.testing.assert_close(got, want.detach(), rtol=1e-5, atol=1e-5)


def test_plain_ddp_is_refused_on_every_rank(tmp_path) -> None:
    ranks = run(tmp_path, "plain")
    for r in range(WORLD):
        assert "runs inside DistributedDataParallel" in ranks[r].get("error", ""), ranks[r]
        assert "cobalt.torch.wrap_ddp(model, group)" in ranks[r]["error"]
        assert "its parameters (moe.experts.w1, moe.experts.w3, moe.experts.w2, ... (4 in all))" \
            in ranks[r]["error"]
