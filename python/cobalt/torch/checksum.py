"""Content digests of tensors (for verifying layout migrations bit for bit)."""

from __future__ import annotations

import hashlib
from typing import Iterable

import torch

__all__ = ["digest"]


def digest(tensors: Iterable[torch.Tensor]) -> int:
    """A signed 64-bit BLAKE2b digest of the bytes of `tensors`, in order (shapes are not hashed:
    equal digests mean equal bytes)."""
    h = hashlib.blake2b(digest_size=8)
    for t in tensors:
        h.update(t.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return int.from_bytes(h.digest(), "little", signed=True)
