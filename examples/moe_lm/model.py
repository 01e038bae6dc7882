"""A tiny byte-level transformer language model whose feed-forward blocks are expert-parallel
MoE layers (cobalt.torch.ExpertParallelMoE)."""

from __future__ import annotations

import torch
from torch import nn

from cobalt.torch import ExpertParallelMoE, ExpertParallelRuntime

__all__ = ["TinyMoELM"]


class Block(nn.Module):
    """Pre-norm causal self-attention + MoE feed-forward, both residual."""

    def __init__(self, moe: ExpertParallelMoE, d_model: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = nn.MultiheadAttention(d_model, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(d_model)
        self.moe = moe

    def forward(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        a = self.ln1(h)
        h = h + self.attn(a, a, a, attn_mask=mask, need_weights=False)[0]
        b, s, d = h.shape
        return h + self.moe(self.ln2(h).reshape(b * s, d)).reshape(b, s, d)


class TinyMoELM(nn.Module):
    """Embedding -> L blocks -> LayerNorm -> tied byte head.

    forward(tokens [B, S] int64) -> logits [B, S, 256]. Dense parameters are data-parallel
    (initialise with the same torch seed on every rank and sum their gradients); the MoE layers'
    experts are expert-parallel.
    """

    def __init__(self, runtime: ExpertParallelRuntime, *, layers: int, d_model: int, heads: int,
                 ffn: int, num_experts: int, top_k: int, seq_len: int, seed: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(256, d_model)
        nn.init.normal_(self.embed.weight, std=0.02)  # tied head: small logits at the start
        self.pos = nn.Parameter(torch.randn(seq_len, d_model) * 0.02)
        self.blocks = nn.ModuleList([
            Block(ExpertParallelMoE(runtime, layer, d_model, ffn, num_experts, top_k, seed=seed),
                  d_model, heads)
            for layer in range(layers)])
        self.ln_f = nn.LayerNorm(d_model)
        mask = torch.triu(torch.full((seq_len, seq_len), float("-inf")), diagonal=1)
        self.register_buffer("mask", mask, persistent=False)

    @property
    def moes(self) -> list[ExpertParallelMoE]:
        return [block.moe for block in self.blocks]  # type: ignore[misc]

    def dense_parameters(self) -> list[nn.Parameter]:
        """Data-parallel parameters whose gradients this model's owner must sum over ranks (the
        MoE layers sum their routers' gradients themselves)."""
        moe_params = {id(p) for moe in self.moes for p in moe.parameters()}
        return [p for p in self.parameters() if id(p) not in moe_params]

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        s = tokens.shape[1]
        h = self.embed(tokens) + self.pos[:s]
        for block in self.blocks:
            h = block(h, self.mask[:s, :s])
        return self.ln_f(h) @ self.embed.weight.t()
