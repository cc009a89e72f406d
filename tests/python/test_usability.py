# SPDX-License-Identifier: Apache-2.0
"""What a new user of the Python module reaches for first: keyword configs, numpy scalars in a
config, the builder's own [T, 1, W] arrays passed on as they are, bf16 helpers for numpy, the
CUDA build flags, and errors that name the Python argument."""

import numpy as np
import pytest

import sparse_swa

BLOCK = 64


def small_config(**overrides):
    fields = dict(window_size=8, block_size=4, max_num_batched_tokens=64, max_num_seqs=8,
                  max_model_len=64)
    fields.update(overrides)
    return fields


def test_keyword_constructor_equals_dict():
    by_kw = sparse_swa.BuilderConfig(**small_config(num_speculative_tokens=2,
                                                    speculative_method="mtp"))
    by_dict = sparse_swa.BuilderConfig.from_dict(small_config(num_speculative_tokens=2,
                                                              speculative_method="mtp"))
    assert by_kw.to_dict() == by_dict.to_dict()
    assert by_kw.window_size == 8 and by_kw.speculative_method == "mtp"
    assert sparse_swa.BuilderConfig().window_size == 0
    with pytest.raises(ValueError, match=r'config: unknown field "windw_size" \(did you mean '
                                         r'"window_size"\?'):
        sparse_swa.BuilderConfig(windw_size=8)
    with pytest.raises(ValueError, match=r"config\.window_size: expected an int, got float"):
        sparse_swa.BuilderConfig(window_size=8.0)


def test_noncausal_index_width_is_a_config_field():
    fields = small_config(num_speculative_tokens=2, speculative_method="dspark",
                          noncausal_index_width=128)
    cfg = sparse_swa.BuilderConfig.from_dict(fields)
    assert cfg.noncausal_index_width == 128
    assert cfg.to_dict()["noncausal_index_width"] == 128
    assert sparse_swa.MetadataBuilder(fields).noncausal_index_width == 128
    derived = sparse_swa.MetadataBuilder(small_config(num_speculative_tokens=2,
                                                      speculative_method="dspark"))
    assert derived.noncausal_index_width == 64  # round_up(W + theta = 11, 64)
    with pytest.raises(ValueError, match=r"config\.noncausal_index_width"):
        sparse_swa.MetadataBuilder(dict(fields, noncausal_index_width=4))


def test_numpy_scalars_and_arrays_in_a_config_dict():
    fields = {k: np.int64(v) for k, v in small_config().items()}
    fields["compress_ratios"] = np.array([1, 4], dtype=np.int64)
    fields["parallel_drafting"] = np.bool_(False)
    cfg = sparse_swa.BuilderConfig.from_dict(fields)
    assert cfg.window_size == 8 and cfg.compress_ratios == [1, 4]
    sparse_swa.MetadataBuilder(fields)  # valid: the builder takes it as well
    with pytest.raises(ValueError, match=r"config\.compress_ratios: expected a list of ints"):
        sparse_swa.BuilderConfig(compress_ratios=np.zeros((1, 2), dtype=np.int64))


def test_cuda_flags_agree():
    flag = sparse_swa.has_cuda_backend
    assert flag() is bool(flag)  # callable like cuda_available(), and a bool as before
    assert flag == bool(flag)
    if not flag:
        assert sparse_swa.cuda_available() is False
    assert repr(flag) in ("True", "False")


def test_bf16_helpers_round_to_nearest_even():
    x = np.array([1.0, -2.5, 1.0 + 2**-8, 1.0 + 3 * 2**-8, 3.0e38, np.nan, 0.0], np.float32)
    bits = sparse_swa.to_bf16_bits(x)
    assert bits.dtype == np.uint16
    # 1 + 2^-8 is a tie -> even (1.0); 1 + 3 * 2^-8 is a tie -> even (1 + 2^-6).
    assert list(bits[:5]) == [0x3F80, 0xC020, 0x3F80, 0x3F82, 0x7F62]
    back = sparse_swa.from_bf16_bits(bits)
    assert back.dtype == np.float32 and np.isnan(back[5]) and back[6] == 0.0
    np.testing.assert_array_equal(back[:2], [1.0, -2.5])
    assert sparse_swa.to_bf16_bits(np.ones((2, 3))).shape == (2, 3)


def build_decode_metadata():
    builder = sparse_swa.MetadataBuilder(small_config())
    qsl = np.array([0, 1, 2], np.int32)
    seq = np.array([5, 9], np.int32)
    bt = np.arange(8, dtype=np.int32).reshape(2, 4)
    slots = np.array([4, 4 * 4 + 8], np.int64)
    return builder, builder.build(qsl, seq, bt, slots)


def test_to_ragged_takes_the_builders_rows():
    _, md = build_decode_metadata()
    rows = md.decode_swa_indices
    assert rows.ndim == 3 and rows.shape[1] == 1
    indptr, flat = sparse_swa.to_ragged(rows, md.decode_swa_lens)
    indptr2, flat2 = sparse_swa.to_ragged(rows[:, 0, :], md.decode_swa_lens)
    np.testing.assert_array_equal(indptr, indptr2)
    np.testing.assert_array_equal(flat, flat2)
    assert list(indptr) == [0, 5, 13]  # seq_lens 5 and 9 against the window of 8
    # Zero-width rows (a window of nothing yet) and no rows at all.
    indptr, flat = sparse_swa.to_ragged(np.zeros((2, 1, 0), np.int32), np.zeros(2, np.int32))
    assert indptr.tolist() == [0, 0, 0] and flat.size == 0
    indptr, flat = sparse_swa.to_ragged(np.zeros((0, 1, 8), np.int32), np.zeros(0, np.int32))
    assert indptr.tolist() == [0] and flat.size == 0
    with pytest.raises(ValueError, match=r"indices: expected \[rows, width\] or \[rows, 1, width\], "
                                         r"got \[2, 2, 8\]"):
        sparse_swa.to_ragged(np.zeros((2, 2, 8), np.int32), md.decode_swa_lens)


def new_cache(num_blocks):
    layout = sparse_swa.page_layout(BLOCK)
    return np.zeros((num_blocks, layout["page_bytes"]), np.uint8)


def test_sparse_attention_takes_the_builders_rows_and_names_arguments():
    rng = np.random.default_rng(5)
    cache = new_cache(2)
    sparse_swa.encode_kv(cache, BLOCK, rng.standard_normal((16, 512)).astype(np.float32),
                         np.arange(16, dtype=np.int64))
    q = sparse_swa.to_bf16_bits(rng.standard_normal((2, 4, 512)))
    idx3 = np.full((2, 1, 8), -1, np.int32)
    idx3[0, 0, :3] = [0, 1, 2]
    idx3[1, 0, :5] = [3, 4, 5, 6, 7]
    lens = np.array([3, 5], np.int32)
    out3, lse3 = sparse_swa.sparse_attention(q, cache, BLOCK, idx3, lens)
    out2, lse2 = sparse_swa.sparse_attention(q, cache, BLOCK, idx3[:, 0, :], lens)
    np.testing.assert_array_equal(out3, out2)
    np.testing.assert_array_equal(lse3, lse2)
    # lens past the width: the library's check, reported under the argument's name.
    with pytest.raises(ValueError, match=r"^lens") as info:
        sparse_swa.sparse_attention(q, cache, BLOCK, idx3, np.array([3, 9], np.int32))
    assert "params." not in str(info.value)
    with pytest.raises(ValueError, match=r"^q: expected dtype bfloat16 or uint16, got float32"):
        sparse_swa.sparse_attention(q.astype(np.float32), cache, BLOCK, idx3, lens)


def test_sparse_attention_writes_given_outputs_in_place():
    rng = np.random.default_rng(6)
    cache = new_cache(1)
    sparse_swa.encode_kv(cache, BLOCK, rng.standard_normal((4, 512)).astype(np.float32),
                         np.arange(4, dtype=np.int64))
    q = sparse_swa.to_bf16_bits(rng.standard_normal((1, 2, 512)))
    idx = np.array([[0, 1, 2, 3]], np.int32)
    lens = np.array([4], np.int32)
    want_out, want_lse = sparse_swa.sparse_attention(q, cache, BLOCK, idx, lens)
    out = np.zeros((1, 2, 512), np.uint16)
    lse = np.zeros((1, 2), np.float32)
    got = sparse_swa.sparse_attention(q, cache, BLOCK, idx, lens, out=out, lse=lse)
    assert got[0] is out and got[1] is lse
    np.testing.assert_array_equal(out, want_out)
    np.testing.assert_array_equal(lse, want_lse)
    with pytest.raises(ValueError, match=r"^out: expected a contiguous \[1, 2, 512\]"):
        sparse_swa.sparse_attention(q, cache, BLOCK, idx, lens, out=np.zeros((1, 4, 512), np.uint16))
    with pytest.raises(ValueError, match=r"^lse: expected dtype float32, got float64"):
        sparse_swa.sparse_attention(q, cache, BLOCK, idx, lens, lse=np.zeros((1, 2)))
    frozen = np.zeros((1, 2, 512), np.uint16)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match=r"^out: "):
        sparse_swa.sparse_attention(q, cache, BLOCK, idx, lens, out=frozen)
