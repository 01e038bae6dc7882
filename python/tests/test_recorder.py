"""RoutingRecorder in one process: hooks on arbitrary router modules -> cobalt-trace v1."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.utils.checkpoint
from torch import nn

import cobalt
from cobalt.torch import RoutingRecorder, TopKRouter


def test_records_linear_and_topk_routers(tmp_path) -> None:
    torch.manual_seed(0)
    logits_router = nn.Linear(6, 8, bias=False)  # outputs logits [T, E]: top-k taken by default
    topk_router = TopKRouter(6, 8, 2, seed=1)  # outputs (ids, weights)
    rec = RoutingRecorder(8, 2, source_rank=3, num_sources=4, metadata={"model": "toy"})
    rec.attach(logits_router, 0)
    rec.attach(topk_router, 1)
    expected: list[list[np.ndarray]] = [[], []]
    for step, tokens in enumerate([5, 0, 7]):
        x = torch.randn(tokens, 6)
        expected[0].append(logits_router(x).topk(2, dim=-1).indices.numpy())
        expected[1].append(topk_router(x)[0].numpy())
        rec.end_step()
    rec.detach()
    logits_router(torch.randn(2, 6))  # detached: not recorded
    path = str(tmp_path / "rec.safetensors")
    assert rec.write(path)
    reader = cobalt.TraceReader(path)
    assert (reader.num_experts, reader.top_k, reader.num_layers, reader.num_steps) == (8, 2, 2, 3)
    np.testing.assert_array_equal(reader.step_offsets, [0, 5, 5, 12])
    for layer in range(2):
        np.testing.assert_array_equal(reader.topk_ids(layer), np.concatenate(expected[layer]))
    np.testing.assert_array_equal(reader.source_rank(), np.full(12, 3))
    assert reader.num_sources == 4 and reader.metadata["model"] == "toy"
    assert reader.metadata["origin"] == "cobalt.torch.RoutingRecorder"


def test_custom_extract_and_errors() -> None:
    router = nn.Linear(4, 6)
    rec = RoutingRecorder(6, 2, extract=lambda m, i, o: torch.full((o.shape[0], 2), 9))
    rec.attach(router, 0)
    with pytest.raises(ValueError, match=r"expert id 9 for token 0 out of range \[0, 6\)"):
        router(torch.randn(3, 4))
    rec.detach()
    rec = RoutingRecorder(6, 2)
    rec.attach(router, 0)
    with pytest.raises(ValueError, match="already attached"):
        rec.attach(router, 0)
    other = nn.Linear(4, 6)
    rec.attach(other, 1)
    router(torch.randn(3, 4))
    other(torch.randn(2, 4))
    with pytest.raises(ValueError, match="different token counts"):
        rec.end_step()
    with pytest.raises(ValueError, match="nothing recorded"):
        rec.trace_data()


@pytest.mark.parametrize("reentrant", [True, False])
def test_checkpoint_recomputation_is_not_recorded(reentrant: bool) -> None:
    """Under activation checkpointing the router runs again during backward: every token is
    recorded once, from the original forward."""
    router = TopKRouter(4, 8, 2, seed=2)
    rec = RoutingRecorder(8, 2)
    rec.attach(router, 0)
    x = torch.randn(5, 4, requires_grad=True)
    out = torch.utils.checkpoint.checkpoint(lambda z: router(z)[1], x, use_reentrant=reentrant)
    out.sum().backward()
    rec.end_step()
    assert x.grad is not None
    data = rec.trace_data()
    np.testing.assert_array_equal(np.asarray(data.topk_ids)[0], router(x)[0].numpy())
