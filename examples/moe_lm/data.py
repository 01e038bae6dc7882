"""Byte-level language-modelling batches from the shared real text, one data domain per node."""

from __future__ import annotations

import os

import numpy as np
import torch

__all__ = ["DOMAINS", "DomainStream", "default_data_dir"]

# OLMoE routing-analysis samples (../shared/data/text/README.md): four different domains.
DOMAINS = ["github_oss_with_stack", "wikipedia", "arxiv", "c4"]


def default_data_dir() -> str:
    """../shared/data/text relative to the repository root."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return os.path.join(os.path.dirname(root), "shared", "data", "text")


class DomainStream:
    """Random windows of one domain's bytes.

    batch(step) -> (inputs [B, S] int64, targets [B, S] int64): B windows of S + 1 bytes at
    offsets drawn from a generator keyed by (seed, rank, step), so every run (static or Cobalt)
    sees exactly the same data.
    """

    def __init__(self, data_dir: str, domain: str, rank: int, batch: int, seq_len: int,
                 seed: int, max_bytes: int = 1 << 20) -> None:
        path = os.path.join(data_dir, f"olmoe-sample-{domain}.txt")
        if not os.path.exists(path):
            raise FileNotFoundError(
                f"{path} not found: the example reads the shared text samples "
                f"(../shared/data/text/, see its README); pass --data-dir")
        with open(path, "rb") as f:
            self.data = np.frombuffer(f.read(max_bytes), dtype=np.uint8)
        if self.data.shape[0] <= seq_len + 1:
            raise ValueError(f"{path}: only {self.data.shape[0]} bytes")
        self.domain = domain
        self.rank = rank
        self.batch_size = batch
        self.seq_len = seq_len
        self.seed = seed

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        rng = np.random.default_rng([self.seed, self.rank, step])
        starts = rng.integers(0, self.data.shape[0] - self.seq_len - 1, size=self.batch_size)
        windows = np.stack([self.data[s:s + self.seq_len + 1] for s in starts]).astype(np.int64)
        w = torch.from_numpy(windows)
        return w[:, :-1], w[:, 1:]
