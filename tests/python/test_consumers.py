# SPDX-License-Identifier: Apache-2.0
"""The SWA-only index consumers through Python: to_ragged, md.mixed_matrix(),
md.combined_prefill(), golden values of docs/semantics.md example 1
(examples/batches/mixed_mtp.json). Compressed layers: test_compressed_topk.py."""

import numpy as np
import pytest

import sparse_swa
from conftest import build_case

# Example 1's decode rows (width 8) and their lens.
DECODE_ROWS = [
    [31, 12, 13, 14, 15, 36, 37, 38],
    [20, 21, 22, 23, 44, -1, -1, -1],
    [20, 21, 22, 23, 44, 45, -1, -1],
]
DECODE_LENS = [8, 5, 6]


def test_to_ragged_example1_decode_rows():
    indptr, flat = sparse_swa.to_ragged(np.array(DECODE_ROWS, dtype=np.int32),
                                        np.array(DECODE_LENS, dtype=np.int32))
    assert indptr.tolist() == [0, 8, 13, 19]
    expected = [v for row, n in zip(DECODE_ROWS, DECODE_LENS) for v in row[:n]]
    assert flat.dtype == np.int32
    assert flat.tolist() == expected


def test_to_ragged_of_builder_rows(mixed_builder, mixed_case):
    md = build_case(mixed_builder, mixed_case)
    indptr, _ = sparse_swa.to_ragged(md.decode_swa_indices[:, 0, :], md.decode_swa_lens)
    assert indptr[: md.num_decode_tokens + 1].tolist() == [0, 8, 13, 19]


def test_to_ragged_strided_rows_use_the_width():
    base = np.full((2, 6), 7, dtype=np.int32)
    base[:, :3] = [[1, 2, 3], [4, 5, 6]]
    indptr, flat = sparse_swa.to_ragged(base[:, :3], np.array([3, 1], dtype=np.int32))
    assert indptr.tolist() == [0, 3, 4]
    assert flat.tolist() == [1, 2, 3, 4]


def test_to_ragged_errors_name_the_field():
    rows = np.zeros((2, 3), dtype=np.int32)
    with pytest.raises(ValueError, match="lens"):
        sparse_swa.to_ragged(rows, np.array([4, 0], dtype=np.int32))  # lens > width
    with pytest.raises(ValueError, match="lens: expected 2 entries"):
        sparse_swa.to_ragged(rows, np.array([1], dtype=np.int32))
    with pytest.raises(ValueError, match="indices"):
        sparse_swa.to_ragged(rows.astype(np.int64), np.array([1, 1], dtype=np.int32))


def test_mixed_matrix_swa_only(mixed_builder, mixed_case):
    md = build_case(mixed_builder, mixed_case)
    indices, lens, swa_lens = md.mixed_matrix()
    assert indices.dtype == np.int32 and indices.shape == (md.num_tokens, 8)
    td = md.num_decode_tokens
    assert td == 3
    assert lens[:td].tolist() == [8, 8, 8]  # lens counts the whole SWA section S = 8
    assert indices[1].tolist() == [20, 21, 22, 23, 44, -1, -1, -1]
    assert indices[:td].tolist() == DECODE_ROWS
    assert swa_lens[:td].tolist() == DECODE_LENS
    # Prefill rows recomputed from the position: example 1's prefill rows.
    assert indices[3].tolist() == [4, 5, 6, 7, 16, 17, 18, -1]
    assert indices[6].tolist() == [6, 7, 16, 17, 18, 19, 32, 33]
    assert swa_lens[3:7].tolist() == [7, 8, 8, 8]


def test_combined_prefill_swa_only(mixed_builder, mixed_case):
    md = build_case(mixed_builder, mixed_case)
    chunks = md.combined_prefill(compress_ratio=1, chunk_size=4)
    assert len(chunks) == 1
    chunk, rows, lens = chunks[0]
    assert chunk == (0, 1, 0, 10)
    assert rows.shape == (4, 128) and rows.dtype == np.int32
    assert rows[0, :8].tolist() == [0, 1, 2, 3, 4, 5, 6, -1]
    assert lens.tolist() == [7, 8, 8, 8]
    assert rows[1, :8].tolist() == list(range(8))
    assert rows[2, :8].tolist() == list(range(1, 9))
    assert rows[3, :8].tolist() == list(range(2, 10))
    assert (rows[:, 8:] == -1).all()


def test_consumer_errors(mixed_builder, mixed_case):
    md = build_case(mixed_builder, mixed_case)
    with pytest.raises(ValueError, match="chunk_size"):
        md.combined_prefill(compress_ratio=1, chunk_size=0)
    with pytest.raises(ValueError, match="^prefill_local: a compress_ratio 4 layer needs the "
                                         "prefill top-k, got none"):
        md.combined_prefill(compress_ratio=4)
    with pytest.raises(ValueError, match="metadata: expected the metadata returned by build"):
        md.copy().mixed_matrix()
    build_case(mixed_builder, mixed_case)
    with pytest.raises(ValueError, match="metadata: expected the metadata of its builder's last"):
        md.mixed_matrix()
