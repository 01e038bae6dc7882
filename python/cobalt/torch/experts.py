"""The MoE math shared by the expert-parallel layer and its single-process reference:
deterministic weight initialisation, the top-k softmax router and SwiGLU experts."""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["TopKRouter", "ReferenceMoE", "expert_init", "router_init", "swiglu"]

_MIX = 0x9E3779B97F4A7C15


def _seed(*parts: int) -> int:
    h = 0
    for p in parts:
        h = (h * _MIX + p + 1) % (1 << 63)
    return h


def expert_init(
    seed: int, layer: int, expert: int, hidden: int, ffn: int, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Initial weights of one expert, a pure function of (seed, layer, expert) so any rank can
    create exactly the experts it owns: w1, w3 [hidden, ffn] and w2 [ffn, hidden]."""
    g = torch.Generator().manual_seed(_seed(seed, layer, expert))
    w1 = torch.randn(hidden, ffn, generator=g, dtype=dtype) / math.sqrt(hidden)
    w3 = torch.randn(hidden, ffn, generator=g, dtype=dtype) / math.sqrt(hidden)
    w2 = torch.randn(ffn, hidden, generator=g, dtype=dtype) / math.sqrt(ffn)
    return w1, w3, w2


def router_init(seed: int, layer: int, hidden: int, num_experts: int,
                dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Initial router weight [num_experts, hidden] (the same on every rank)."""
    g = torch.Generator().manual_seed(_seed(seed, layer, 0x7FFFFFFF))
    return torch.randn(num_experts, hidden, generator=g, dtype=dtype) / math.sqrt(hidden)


def swiglu(x: torch.Tensor, w1: torch.Tensor, w3: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """SwiGLU expert: (silu(x w1) * (x w3)) w2 for x [n, hidden] -> [n, hidden]."""
    return (F.silu(x @ w1) * (x @ w3)) @ w2


class TopKRouter(nn.Module):
    """Linear router (no bias) -> softmax over E -> top-k.

    forward(x [T, hidden]) -> (topk_ids [T, K] int64, topk_weights [T, K] float). With
    `normalize` the K weights are renormalised to sum to 1 (Mixtral style); otherwise they are the
    softmax probabilities (OLMoE style).
    """

    def __init__(self, hidden: int, num_experts: int, top_k: int, *, seed: int = 0,
                 layer: int = 0, normalize: bool = False) -> None:
        super().__init__()
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"TopKRouter: top_k {top_k} out of range [1, {num_experts}]")
        self.top_k = top_k
        self.normalize = normalize
        self.weight = nn.Parameter(router_init(seed, layer, hidden, num_experts))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        probs = torch.softmax(x @ self.weight.t(), dim=-1)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        if self.normalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return ids, weights


class ReferenceMoE(nn.Module):
    """Single-process MoE with every expert local: the ground truth the expert-parallel layer is
    tested against. Weights w1, w3 [E, hidden, ffn], w2 [E, ffn, hidden] come from the same
    :func:`expert_init` as :class:`~cobalt.torch.ExpertParallelMoE` with the same seed and layer.

    forward(x [T, hidden], router_chunks=None) -> [T, hidden]. `router_chunks` (token counts per
    chunk) evaluates the router chunk by chunk, as each expert-parallel rank does for its own
    tokens, so the top-k choice sees bitwise the same logits (matrix products of different
    heights may round differently).
    """

    def __init__(self, hidden: int, ffn: int, num_experts: int, top_k: int, *, seed: int = 0,
                 layer: int = 0, normalize: bool = False) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.router = TopKRouter(hidden, num_experts, top_k, seed=seed, layer=layer,
                                 normalize=normalize)
        weights = [expert_init(seed, layer, e, hidden, ffn) for e in range(num_experts)]
        self.w1 = nn.Parameter(torch.stack([w[0] for w in weights]))
        self.w3 = nn.Parameter(torch.stack([w[1] for w in weights]))
        self.w2 = nn.Parameter(torch.stack([w[2] for w in weights]))
        self.last_topk_ids: Optional[torch.Tensor] = None

    def forward(self, x: torch.Tensor, router_chunks: Optional[Sequence[int]] = None) -> torch.Tensor:
        if router_chunks is None:
            ids, gates = self.router(x)
        else:
            outs = [self.router(part) for part in torch.split(x, list(router_chunks))]
            ids = torch.cat([o[0] for o in outs])
            gates = torch.cat([o[1] for o in outs])
        self.last_topk_ids = ids.detach()
        y = torch.zeros_like(x)
        for e in range(self.num_experts):
            tok, pos = torch.nonzero(ids == e, as_tuple=True)
            if tok.numel() == 0:
                continue
            out = swiglu(x[tok], self.w1[e], self.w3[e], self.w2[e]) * gates[tok, pos, None]
            y = y.index_add(0, tok, out)
        return y
