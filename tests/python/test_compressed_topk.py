# SPDX-License-Identifier: Apache-2.0
"""compressed_topk_to_global from Python on host metadata: a hand-computed case, outputs given
in place, and errors naming the Python argument."""

import numpy as np
import pytest

import sparse_swa

CONFIG = {"window_size": 8, "block_size": 4, "max_num_batched_tokens": 64, "max_num_seqs": 8,
          "max_model_len": 64, "compress_ratios": [1, 4]}


def decode_step():
    builder = sparse_swa.MetadataBuilder(CONFIG)
    md = builder.build(np.array([0, 1, 2], np.int32), np.array([5, 9], np.int32),
                       np.arange(8, dtype=np.int32).reshape(2, 4), np.array([4, 24], np.int64))
    return builder, md


LOCAL = np.array([[0, 1, -1, 5], [2, -1, 3, 4]], np.int32)
CBT = np.array([[7, 8], [9, 10]], np.int32)  # compressed blocks of 4 entries


def test_golden_mapping():
    _, md = decode_step()
    out, lens = sparse_swa.compressed_topk_to_global(md, 0, LOCAL, CBT, 4, 4)
    # l -> cbt[r][l // 4] * 4 + l % 4; -1 stays -1; lens counts the mapped entries.
    assert out.tolist() == [[28, 29, -1, 33], [38, -1, 39, 40]]
    assert lens.tolist() == [3, 3]
    # One token from token 1 on; a local index past the compressed table maps to -1.
    out, lens = sparse_swa.compressed_topk_to_global(md, 1, np.array([[8, 0]], np.int32), CBT, 4, 4)
    assert out.tolist() == [[-1, 36]] and lens.tolist() == [1]


def test_outputs_given_in_place_and_wider():
    _, md = decode_step()
    out = np.full((2, 6), 99, np.int32)
    out_lens = np.zeros(2, np.int32)
    got = sparse_swa.compressed_topk_to_global(md, 0, LOCAL[:, None, :], CBT, 4, 4, out=out,
                                               out_lens=out_lens)
    assert got[0] is out and got[1] is out_lens
    assert out.tolist() == [[28, 29, -1, 33, -1, -1], [38, -1, 39, 40, -1, -1]]
    assert out_lens.tolist() == [3, 3]


def test_errors_name_the_argument():
    builder, md = decode_step()
    with pytest.raises(ValueError, match=r"^compress_ratio: expected 2, 4 or 128"):
        sparse_swa.compressed_topk_to_global(md, 0, LOCAL, CBT, 4, 1)
    with pytest.raises(ValueError, match=r"^block_table"):
        sparse_swa.compressed_topk_to_global(md, 0, LOCAL, CBT[:1], 4, 4)
    with pytest.raises(ValueError, match=r"^local"):
        sparse_swa.compressed_topk_to_global(md, 1, LOCAL, CBT, 4, 4)  # tokens 1..2 of 2
    with pytest.raises(ValueError, match=r"^local: expected dtype int32, got int64"):
        sparse_swa.compressed_topk_to_global(md, 0, LOCAL.astype(np.int64), CBT, 4, 4)
    with pytest.raises(ValueError, match=r"^metadata: expected the SwaMetadata"):
        sparse_swa.compressed_topk_to_global(None, 0, LOCAL, CBT, 4, 4)
    builder.build(np.array([0, 1], np.int32), np.array([3], np.int32),
                  np.zeros((1, 4), np.int32), np.array([2], np.int64))
    with pytest.raises(ValueError, match=r"^metadata: expected the metadata of its builder's last"):
        sparse_swa.compressed_topk_to_global(md, 0, LOCAL, CBT, 4, 4)


def compressed_step():
    """Two decode requests (seq 5 and 20) then a 5-token prefill, W = 8, B = 4, C4A layers."""
    builder = sparse_swa.MetadataBuilder(dict(CONFIG, max_model_len=64))
    bt = np.arange(15, dtype=np.int32).reshape(3, 5)
    seq = np.array([5, 20, 5], np.int32)
    req, pos = [0, 1, 2, 2, 2, 2, 2], [4, 19, 0, 1, 2, 3, 4]
    slots = np.array([bt[r, p // 4] * 4 + p % 4 for r, p in zip(req, pos)], np.int64)
    md = builder.build(np.array([0, 1, 2, 7], np.int32), seq, bt, slots)
    return md


CBT3 = np.array([[7, 8], [9, 10], [11, 12]], np.int32)
DECODE_LOCAL = np.array([[0, 1, -1, 5], [2, -1, 3, 4]], np.int32)
PREFILL_LOCAL = np.array([[0, 1, 2, 3]] * 5, np.int32)  # TOP_K 4


def test_mixed_matrix_of_a_compressed_layer():
    md = compressed_step()
    swa_rows, swa_lens_only, swa_exact = md.mixed_matrix()
    rows, lens, swa_lens = md.mixed_matrix(compress_ratio=4, block_table=CBT3, block_size=4,
                                           decode_local=DECODE_LOCAL, prefill_local=PREFILL_LOCAL)
    # S = 8 (W), P = round_up(max(TOP_K 4, decode topk 4), 4) = 4: rows of 12.
    assert rows.shape == (7, 12) and swa_rows.shape == (7, 8)
    np.testing.assert_array_equal(rows[:, :8], swa_rows)
    np.testing.assert_array_equal(swa_lens, swa_exact)
    # Decode rows: the compressed section is compressed_topk_to_global's mapping.
    mapped, counts = sparse_swa.compressed_topk_to_global(md, 0, DECODE_LOCAL, CBT3, 4, 4)
    np.testing.assert_array_equal(rows[:2, 8:], mapped)
    assert lens[:2].tolist() == (8 + counts).tolist()
    # Prefill rows: min((pos + 1) // 4, TOP_K) entries: positions 0..2 none, 3 and 4 one
    # (local 0 -> block 11, slot 44).
    assert (lens[2:] - swa_lens_only[2:]).tolist() == [0, 0, 0, 1, 1]
    assert rows[5, 8] == 44 and rows[6, 8] == 44 and (rows[2:5, 8:] == -1).all()


def test_combined_prefill_of_a_compressed_layer():
    md = compressed_step()
    [(chunk1, rows1, lens1)] = md.combined_prefill(1, 4)
    [(chunk4, rows4, lens4)] = md.combined_prefill(4, 4, prefill_local=PREFILL_LOCAL)
    n = chunk4[2]  # N: the request's compressed entries, 5 // 4 = 1
    assert chunk1[2] == 0 and n == 1 and chunk4[:2] == chunk1[:2]
    topk_len = np.array([0, 0, 0, 1, 1])
    np.testing.assert_array_equal(lens4, lens1 + topk_len)
    for t in range(5):
        k, s = topk_len[t], lens1[t]
        assert rows4[t, :k].tolist() == PREFILL_LOCAL[t, :k].tolist()  # workspace rows 0..N-1
        np.testing.assert_array_equal(rows4[t, k:k + s], rows1[t, :s] + n)  # SWA after N
    with pytest.raises(ValueError, match=r"^prefill_local"):
        md.combined_prefill(4, 4, prefill_local=PREFILL_LOCAL[:2])


def test_compressed_mixed_matrix_errors_name_the_argument():
    md = compressed_step()
    with pytest.raises(ValueError, match=r"decode_local"):
        md.mixed_matrix(compress_ratio=4, block_table=CBT3, block_size=4,
                        decode_local=DECODE_LOCAL[:1], prefill_local=PREFILL_LOCAL)
    with pytest.raises(ValueError, match=r"^block_table"):
        md.mixed_matrix(compress_ratio=4, block_table=CBT3[:1], block_size=4,
                        decode_local=DECODE_LOCAL, prefill_local=PREFILL_LOCAL)
    with pytest.raises(ValueError, match=r"^decode_global: expected decode_global and "):
        md.mixed_matrix(compress_ratio=128, block_table=CBT3, block_size=2,
                        decode_global=DECODE_LOCAL)
    with pytest.raises(ValueError, match=r"compress_ratio 1"):
        md.mixed_matrix(decode_local=DECODE_LOCAL)
