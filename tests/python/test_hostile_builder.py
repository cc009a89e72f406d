"""Hostile-but-plausible input through Python (CPU backend): inputs a caller can get wrong
or write behind the library's back. Each must give a ValueError naming the field, or the result
an untouched call gives; never a crash or wrong rows."""

import numpy as np
import pytest

import sparse_swa

BLOCK = 64


def test_sparse_attention_rejects_indices_below_minus_one():
    layout = sparse_swa.page_layout(BLOCK, "fp8_ds_mla", "flashmla")
    cache = np.zeros((1, layout["page_bytes"]), dtype=np.uint8)
    q = np.zeros((1, 1, 512), dtype=np.uint16)
    indices = np.array([[0, -1, -5]], dtype=np.int32)
    with pytest.raises(ValueError, match=(r"swa_indices\[0\]\[2\]: slot -5 is below -1 "
                                          r"\(expected -1 for a hole or a slot in \[0, 64\)\)")):
        sparse_swa.sparse_attention(q, cache, BLOCK, indices, np.array([3], dtype=np.int32))
    # Past the row's length the entry is never read.
    out, lse = sparse_swa.sparse_attention(q, cache, BLOCK, indices, np.array([2], np.int32))
    assert lse.shape == (1, 1)
