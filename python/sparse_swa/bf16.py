# SPDX-License-Identifier: Apache-2.0
"""bfloat16 for numpy users: numpy has no bfloat16 dtype, so host queries and outputs of
sparse_attention are bf16 bit patterns in uint16 arrays. Torch users pass torch.bfloat16."""

from __future__ import annotations

import numpy as np


def to_bf16_bits(x) -> np.ndarray:
    """float32 values -> bf16 bit patterns (uint16, same shape), rounded to nearest even, as
    torch's float32 -> bfloat16 conversion does; NaN stays a quiet NaN."""
    f = np.ascontiguousarray(x, dtype=np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    bits = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    bits[np.isnan(f)] = 0x7FC0
    return bits


def from_bf16_bits(bits) -> np.ndarray:
    """bf16 bit patterns (uint16) -> float32 values (exact), same shape."""
    b = np.ascontiguousarray(bits, dtype=np.uint16)
    return (b.astype(np.uint32) << 16).view(np.float32)
