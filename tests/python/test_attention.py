# SPDX-License-Identifier: Apache-2.0
"""The KV cache codec and the sparse attention through Python (host numpy arrays, CPU backend)."""

import math

import numpy as np
import pytest

import sparse_swa

BLOCK = 64


def to_bf16_bits(x):
    """float32 -> bf16 bit patterns (uint16), round to nearest even (finite inputs)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def from_bf16_bits(b):
    return (b.astype(np.uint32) << 16).view(np.float32)


def new_cache(num_blocks, dtype="fp8_ds_mla", consumer="flashmla"):
    layout = sparse_swa.page_layout(BLOCK, dtype, consumer)
    return np.zeros((num_blocks, layout["page_bytes"]), dtype=np.uint8)


def test_page_layout_golden():
    assert sparse_swa.page_layout(64, "fp8_ds_mla", "flashmla") == {
        "block_size": 64, "compress_ratio": 1, "dtype": "fp8_ds_mla", "consumer": "flashmla",
        "head_size": 512, "token_bytes": 584, "content_bytes": 37376, "alignment": 576,
        "page_bytes": 37440,
    }
    bf16 = sparse_swa.page_layout(64, "bf16", "flashinfer")
    assert bf16["token_bytes"] == 1024 and bf16["page_bytes"] == 65536


def test_compressed_page_layout_golden():
    # The main-model block (256) over the ratio: 64-entry C4A pages, 2-entry C128A pages.
    c4a = sparse_swa.compressed_page_layout(256, 4)
    assert (c4a["block_size"], c4a["compress_ratio"], c4a["page_bytes"]) == (64, 4, 37440)
    assert sparse_swa.compressed_page_layout(256, 128) == {
        "block_size": 2, "compress_ratio": 128, "dtype": "fp8_ds_mla", "consumer": "flashmla",
        "head_size": 512, "token_bytes": 584, "content_bytes": 1168, "alignment": 576,
        "page_bytes": 1728,
    }
    bf16 = sparse_swa.compressed_page_layout(256, 128, "bf16", "flashinfer")
    assert (bf16["block_size"], bf16["page_bytes"]) == (2, 2048)


def test_two_entry_pages_round_trip_like_swa_pages():
    # A C128A cache (2-entry pages) stores and returns what a 64-token SWA cache does.
    c128a = sparse_swa.compressed_page_layout(256, 128)
    small = np.zeros((8, c128a["page_bytes"]), dtype=np.uint8)
    large = new_cache(1)
    rows = np.random.default_rng(3).standard_normal((16, 512)).astype(np.float32)
    slots = np.random.default_rng(4).permutation(16).astype(np.int64)
    sparse_swa.encode_kv(small, 2, rows, slots)
    sparse_swa.encode_kv(large, BLOCK, rows, slots)
    np.testing.assert_array_equal(sparse_swa.decode_kv(small, 2, slots),
                                  sparse_swa.decode_kv(large, BLOCK, slots))


def test_compressed_page_layout_errors_name_the_argument():
    with pytest.raises(ValueError, match=r"compress_ratio: expected 2, 4 or 128 .*got 1"):
        sparse_swa.compressed_page_layout(256, 1)
    with pytest.raises(ValueError, match=r"attn_block_size: expected a positive multiple of 32 "
                                         r"and of compress_ratio 128, got 64"):
        sparse_swa.compressed_page_layout(64, 128)
    with pytest.raises(ValueError, match="attn_block_size"):
        sparse_swa.compressed_page_layout(2.5, 4)


def test_codec_round_trip_within_fp8_bound():
    rng = np.random.default_rng(7)
    n = 20
    rows = (rng.standard_normal((n, 512)) * rng.uniform(1e-3, 100, (n, 1))).astype(np.float32)
    slots = rng.permutation(2 * BLOCK)[:n].astype(np.int64)
    cache = new_cache(2)
    sparse_swa.encode_kv(cache, BLOCK, rows, slots)
    back = sparse_swa.decode_kv(cache, BLOCK, slots)
    assert back.dtype == np.float32 and back.shape == (n, 512)
    for i in range(n):
        for tile in range(7):
            x = rows[i, tile * 64:(tile + 1) * 64].astype(np.float64)
            y = back[i, tile * 64:(tile + 1) * 64].astype(np.float64)
            scale = 2.0 ** math.ceil(math.log2(max(np.abs(x).max(), 1e-4) / 448))
            # e4m3: 3 mantissa bits (half-ulp 2^-4 relative), subnormal step 2^-9 of the scale.
            assert (np.abs(x - y) <= np.abs(x) / 16 + scale * 2.0**-10 + 1e-30).all(), (i, tile)
        rope = rows[i, 448:]
        assert np.array_equal(back[i, 448:], from_bf16_bits(to_bf16_bits(rope)))
    # Slot -1 is skipped on encode and decodes to zeros.
    zero = sparse_swa.decode_kv(cache, BLOCK, np.array([-1], dtype=np.int64))
    assert (zero == 0).all()


def test_attention_single_key_equals_that_key_and_empty_row():
    rng = np.random.default_rng(3)
    key = rng.standard_normal((1, 512)).astype(np.float32)
    cache = new_cache(2)
    sparse_swa.encode_kv(cache, BLOCK, key, np.array([70], dtype=np.int64))
    decoded = sparse_swa.decode_kv(cache, BLOCK, np.array([70], dtype=np.int64))[0]
    heads = 4
    q = to_bf16_bits(rng.standard_normal((2, heads, 512)).astype(np.float32))
    indices = np.array([[-1, 70, -1], [70, -1, -1]], dtype=np.int32)
    lens = np.array([2, 0], dtype=np.int32)  # row 0: one key (the -1 hole skipped); row 1: none
    out, lse = sparse_swa.sparse_attention(q, cache, BLOCK, indices, lens)
    assert out.dtype == np.uint16 and out.shape == (2, heads, 512)
    assert lse.dtype == np.float32 and lse.shape == (2, heads)
    for h in range(heads):
        assert np.array_equal(out[0, h], to_bf16_bits(decoded))
        logit = 512**-0.5 * np.dot(from_bf16_bits(q[0, h]).astype(np.float64), decoded)
        assert lse[0, h] == pytest.approx(logit, rel=1e-5, abs=1e-5)
    assert np.isposinf(lse[1]).all()
    assert (out[1] == 0).all()


def test_attention_sinks_scale_the_output():
    rng = np.random.default_rng(5)
    key = rng.standard_normal((1, 512)).astype(np.float32)
    cache = new_cache(1)
    sparse_swa.encode_kv(cache, BLOCK, key, np.array([3], dtype=np.int64))
    decoded = sparse_swa.decode_kv(cache, BLOCK, np.array([3], dtype=np.int64))[0]
    q = np.zeros((1, 1, 512), dtype=np.uint16)  # q = 0: lse = 0
    sinks = np.array([0.0], dtype=np.float32)  # out *= 1 / (1 + e^0) = 0.5
    out, lse = sparse_swa.sparse_attention(q, cache, BLOCK, np.array([[3]], dtype=np.int32),
                                           np.array([1], dtype=np.int32), scale=1.0, sinks=sinks)
    assert lse[0, 0] == 0.0
    assert np.array_equal(out[0, 0], to_bf16_bits(decoded * np.float32(0.5)))


def test_attention_kernel_choice_is_checked_and_host_arrays_have_one_path():
    rng = np.random.default_rng(9)
    cache = new_cache(2)
    sparse_swa.encode_kv(cache, BLOCK, rng.standard_normal((3, 512)).astype(np.float32),
                         np.array([1, 5, 70], dtype=np.int64))
    q = to_bf16_bits(rng.standard_normal((1, 2, 512)).astype(np.float32))
    idx, lens = np.array([[1, 5, 70]], dtype=np.int32), np.array([3], dtype=np.int32)
    out, lse = sparse_swa.sparse_attention(q, cache, BLOCK, idx, lens)
    for kernel in ("sm90_tile32", "sm90_pairs"):  # CUDA only: the CPU reference ignores it
        got_out, got_lse = sparse_swa.sparse_attention(q, cache, BLOCK, idx, lens, kernel=kernel)
        assert np.array_equal(got_out, out) and np.array_equal(got_lse, lse)
    expected = '^kernel: expected "auto", "sm90_tile32" or "sm90_pairs", got'
    with pytest.raises(ValueError, match=expected):
        sparse_swa.sparse_attention(q, cache, BLOCK, idx, lens, kernel="fast")


def test_query_group_size_is_a_checked_hint_the_host_path_ignores():
    rng = np.random.default_rng(10)
    cache = new_cache(2)
    sparse_swa.encode_kv(cache, BLOCK, rng.standard_normal((4, 512)).astype(np.float32),
                         np.array([1, 5, 70, 9], dtype=np.int64))
    q = to_bf16_bits(rng.standard_normal((3, 2, 512)).astype(np.float32))
    idx = np.array([[1, 5, 70], [5, 70, 9], [9, 9, -1]], dtype=np.int32)
    lens = np.array([3, 3, 2], dtype=np.int32)
    out, lse = sparse_swa.sparse_attention(q, cache, BLOCK, idx, lens)
    got_out, got_lse = sparse_swa.sparse_attention(q, cache, BLOCK, idx, lens, query_group_size=2)
    assert np.array_equal(got_out, out) and np.array_equal(got_lse, lse)
    for bad in (0, 9):
        with pytest.raises(ValueError, match=f"^query_group_size: expected 1..8, got {bad}"):
            sparse_swa.sparse_attention(q, cache, BLOCK, idx, lens, query_group_size=bad)


def test_workspace_is_checked_and_the_host_path_ignores_it():
    rng = np.random.default_rng(11)
    cache = new_cache(2)
    sparse_swa.encode_kv(cache, BLOCK, rng.standard_normal((3, 512)).astype(np.float32),
                         np.array([1, 5, 70], dtype=np.int64))
    q = to_bf16_bits(rng.standard_normal((2, 4, 512)).astype(np.float32))
    idx = np.array([[1, 5, 70], [70, -1, 1]], dtype=np.int32)
    lens = np.array([3, 3], dtype=np.int32)
    # Host arrays need no workspace: the CPU reference has one path.
    assert sparse_swa.sparse_attention_workspace_bytes(q, cache, BLOCK, idx, lens) == 0
    out, lse = sparse_swa.sparse_attention(q, cache, BLOCK, idx, lens)
    got_out, got_lse = sparse_swa.sparse_attention(q, cache, BLOCK, idx, lens,
                                                   workspace=np.zeros(64, np.uint8))
    assert np.array_equal(got_out, out) and np.array_equal(got_lse, lse)
    with pytest.raises(ValueError, match="^workspace: expected dtype uint8"):
        sparse_swa.sparse_attention(q, cache, BLOCK, idx, lens, workspace=np.zeros(16, np.float32))
    read_only = np.zeros(64, np.uint8)
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match="^workspace: "):
        sparse_swa.sparse_attention(q, cache, BLOCK, idx, lens, workspace=read_only)
    # The bytes query checks its arrays as the call does.
    with pytest.raises(ValueError, match="^lens: expected 2 entries"):
        sparse_swa.sparse_attention_workspace_bytes(q, cache, BLOCK, idx, lens[:1])
    with pytest.raises(ValueError, match="^extra_indices: required with the other extra_"):
        sparse_swa.sparse_attention_workspace_bytes(q, cache, BLOCK, idx, lens, extra_cache=cache)


def test_codec_and_attention_errors_name_the_field():
    cache = new_cache(1)
    rows = np.zeros((1, 512), dtype=np.float32)
    with pytest.raises(ValueError, match="block_size"):
        sparse_swa.page_layout(33, "fp8_ds_mla", "flashmla")
    with pytest.raises(ValueError, match="consumer"):
        sparse_swa.page_layout(64, "fp8_ds_mla", "nope")
    with pytest.raises(ValueError, match="slot"):
        sparse_swa.encode_kv(cache, BLOCK, rows, np.array([BLOCK], dtype=np.int64))
    with pytest.raises(ValueError, match="rows: expected dtype float32 or bfloat16 or uint16, got int32"):
        sparse_swa.encode_kv(cache, BLOCK, rows.astype(np.int32), np.array([0], dtype=np.int64))
    with pytest.raises(ValueError, match="slots: expected a contiguous array"):
        sparse_swa.decode_kv(cache, BLOCK, np.zeros(4, dtype=np.int64)[::2])
    q = np.zeros((1, 1, 512), dtype=np.uint16)
    idx = np.array([[0]], dtype=np.int32)
    with pytest.raises(ValueError, match="lens: expected 1 entries"):
        sparse_swa.sparse_attention(q, cache, BLOCK, idx, np.array([1, 1], dtype=np.int32))
    with pytest.raises(ValueError, match="^indices"):
        sparse_swa.sparse_attention(q, cache, BLOCK, np.array([[BLOCK]], dtype=np.int32),
                                    np.array([1], dtype=np.int32))
    with pytest.raises(ValueError, match="q: expected dtype bfloat16 or uint16, got float32"):
        sparse_swa.sparse_attention(q.astype(np.float32), cache, BLOCK, idx,
                                    np.array([1], dtype=np.int32))
