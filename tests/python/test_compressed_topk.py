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
