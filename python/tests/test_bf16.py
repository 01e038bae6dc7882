"""The expert-parallel layer in bfloat16 on gloo (2 nodes x 2 ranks, one launch).

gloo in torch 1.13 can neither all_to_all nor all_reduce bfloat16; the runtime exchanges it as
bytes and sums it in float32 (cobalt.torch.all_to_all, cobalt.torch.reduce). Checked here:

* exchange_rows carries bfloat16 rows of one, two and three dimensions bit for bit;
* forward outputs and every gradient equal a single-process bfloat16 ReferenceMoE's within
  bfloat16 rounding, for a policy with replicas, a fixed layout with many replicas and a layout
  that changes every step (main instances migrating);
* migrations move bfloat16 weights bit for bit (the gathered main weights equal the reference's
  after every layout change);
* 20 Adam steps in bfloat16 with layout changes and one injected corruption (rolled back) end
  close to the same training on the static layout, and their state_dict loads into a fresh
  bfloat16 model bit for bit.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

from cobalt.torch import ReferenceMoE, launch

import ep_workers
from ep_workers import Sizes

NODES, RANKS_PER_NODE = 2, 2
WORLD = NODES * RANKS_PER_NODE
SIZES = Sizes(hidden=8, ffn=16, num_experts=8, top_k=2, training_steps=20)
CASES = ["cobalt", "replicated", "scheduled"]
# bfloat16 keeps 8 significant bits: sums in a different order differ by a few units of the
# last place of values of order 1.
RTOL, ATOL = 3e-2, 3e-2


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out_dir = str(tmp_path_factory.mktemp("bf16"))
    launch(ep_workers.bf16_worker, WORLD, (RANKS_PER_NODE, out_dir, SIZES, CASES),
           timeout_s=150, collective_timeout_s=60)
    results = [torch.load(os.path.join(out_dir, f"rank{r}.pt")) for r in range(WORLD)]
    for r, res in enumerate(results):
        assert not res["failures"], f"rank {r}: {res['failures']}"
    return results


def test_bf16_exchange_rows_of_any_rank_arrive_bit_for_bit(ranks: list[dict[str, Any]]) -> None:
    # 1-d rows too: the byte view must widen a column, not the rows.
    for r, res in enumerate(ranks):
        rows = res["exchange_rows"]
        for dims in (1, 2, 3):
            got, want = rows[f"got{dims}d"], rows[f"want{dims}d"]
            assert got.dtype == torch.bfloat16 and got.shape == want.shape, (r, dims)
            assert torch.equal(got, want), (r, dims)
        assert bool(rows["zero_d_error"]), r


def _reference_step(step: int) -> dict[str, Any]:
    sz = SIZES
    ref = ReferenceMoE(sz.hidden, sz.ffn, sz.num_experts, sz.top_k, seed=sz.seed).to(
        torch.bfloat16)
    data = [ep_workers.batch_of(r, step, sz.hidden) for r in range(WORLD)]
    x = torch.cat([d[0] for d in data]).to(torch.bfloat16).requires_grad_(True)
    target = torch.cat([d[1] for d in data]).to(torch.bfloat16)
    y = ref(x, router_chunks=[d[0].shape[0] for d in data])
    (y * target).sum().backward()
    return {"y": y.detach(), "x_grad": x.grad, "router_grad": ref.router.weight.grad,
            "expert_grads": [ref.w1.grad, ref.w3.grad, ref.w2.grad],
            "weights": [ref.w1.detach(), ref.w3.detach(), ref.w2.detach()]}


@pytest.mark.parametrize("case", CASES)
def test_bf16_forward_and_gradients_match_reference(ranks: list[dict[str, Any]],
                                                    case: str) -> None:
    saw_replicas = False
    versions = set()
    for step in range(SIZES.equivalence_steps):
        ref = _reference_step(step)
        got = [ranks[r]["equivalence"][case][step] for r in range(WORLD)]
        y = torch.cat([g["y"] for g in got])
        assert y.dtype == torch.bfloat16
        torch.testing.assert_close(y, ref["y"], rtol=RTOL, atol=ATOL)
        torch.testing.assert_close(torch.cat([g["x_grad"] for g in got]), ref["x_grad"],
                                   rtol=RTOL, atol=ATOL)
        for r in range(WORLD):
            torch.testing.assert_close(got[r]["router_grad"], ref["router_grad"], rtol=RTOL,
                                       atol=ATOL)
        for mine, theirs in zip(got[0]["expert_grads"], ref["expert_grads"]):
            assert mine.dtype == torch.bfloat16
            torch.testing.assert_close(mine, theirs, rtol=RTOL, atol=ATOL)
        # No optimizer: whatever the layout did, every main instance holds its initial bits.
        for mine, theirs in zip(got[0]["main_weights"], ref["weights"]):
            assert torch.equal(mine, theirs), f"{case} step {step}: main weights changed"
        saw_replicas |= got[0]["num_replicas"] > SIZES.num_experts
        versions.add(got[0]["version"])
    assert saw_replicas, f"{case}: no step ran with replicated experts"
    if case == "scheduled":
        assert len(versions) == SIZES.equivalence_steps, "the layout must change every step"


def test_bf16_training_with_layout_changes_stays_close_to_static(
        ranks: list[dict[str, Any]]) -> None:
    runs = ranks[0]["training"]
    sched, static = runs["scheduled"], runs["static"]
    assert sched["counters"][0]["rollbacks"] == 1, "the injected corruption must be rolled back"
    assert sched["versions"][0] > 2 and static["versions"] == [1, 1]
    initial = ReferenceMoE(SIZES.hidden, SIZES.ffn, SIZES.num_experts, SIZES.top_k,
                           seed=SIZES.seed).to(torch.bfloat16).w1.detach()
    assert (static["weights"][0][0] - initial).abs().max() > 5e-2, "training changed nothing"
    for layer in range(2):
        for mine, ref in zip(sched["weights"][layer], static["weights"][layer]):
            assert mine.dtype == torch.bfloat16 and bool(torch.isfinite(mine).all())
            # Adam in bfloat16 from differently ordered sums: close, not equal.
            torch.testing.assert_close(mine.float(), ref.float(), rtol=0.1, atol=0.05)
    for run in (sched, static):  # the checkpoint round trip keeps every bit
        for layer in range(2):
            for mine, loaded in zip(run["weights"][layer], run["loaded"][layer]):
                assert loaded.dtype == torch.bfloat16 and torch.equal(mine, loaded)
    for r in range(1, WORLD):
        assert ranks[r]["training"]["scheduled"]["counters"] == sched["counters"]
