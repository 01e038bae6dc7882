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


def reference() -> tuple[list[ReferenceMoE], torch.nn.Linear]:
    moes = [ReferenceMoE(dw.HIDDEN, dw.FFN, dw.EXPERTS, dw.TOP_K, seed=dw.SEED, layer=layer)
            for layer in range(2)]
    head = dw.head()
    params = [p for moe in moes for p in moe.parameters()] + list(head.parameters())
    opt = torch.optim.SGD(params, lr=dw.LR)
    for step in range(dw.STEPS):
        batches = [dw.batch_of(r, step) for r in range(WORLD)]
        x = torch.cat([b[0] for b in batches])
        target = torch.cat([b[1] for b in batches])
        chunks = [b[0].shape[0] for b in batches]
        y = head(x + moes[0](x, router_chunks=chunks) + moes[1](x, router_chunks=chunks))
        (((y - target) ** 2).sum() / WORLD).backward()  # the mean of the ranks' losses
        opt.step()
        opt.zero_grad(set_to_none=True)
    return moes, head


def assert_all_close(got: list[torch.Tensor], want: list[torch.Tensor]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w.detach(), rtol=1e-5, atol=1e-5)


def test_wrap_ddp_trains_like_the_reference(tmp_path) -> None:
    ranks = run(tmp_path, "wrapped")
    moes, head = reference()
    assert min(ranks[0]["versions"]) > 1  # the layouts changed while training
    for r in range(WORLD):
        assert ranks[r]["children"] == [["router", "experts"]] * 2
        assert ranks[r]["state_keys"] == len(dw.Net([moes[0], moes[1]]).state_dict()) + 2
        for layer, moe in enumerate(moes):
            assert_all_close(ranks[r]["experts"][layer], [moe.w1, moe.w3, moe.w2])
            assert_all_close(ranks[r]["router"][layer], list(moe.router.parameters()))
        assert_all_close(ranks[r]["head"], list(head.parameters()))


def test_plain_ddp_is_refused_on_every_rank(tmp_path) -> None:
    ranks = run(tmp_path, "plain")
    for r in range(WORLD):
        assert "runs inside DistributedDataParallel" in ranks[r].get("error", ""), ranks[r]
        assert "cobalt.torch.wrap_ddp(model, group)" in ranks[r]["error"]
        shown = "moes.0.experts.w1, moes.0.experts.w3, moes.0.experts.w2, ... (4 in all)"
        assert f"its parameters ({shown})" in ranks[r]["error"]
