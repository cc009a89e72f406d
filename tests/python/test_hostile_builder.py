# SPDX-License-Identifier: Apache-2.0
"""Hostile-but-plausible input through Python (CPU backend): inputs a caller can get wrong
or write behind the library's back. Each must give a ValueError naming the field, or the result
an untouched call gives; never a crash or wrong rows."""

import numpy as np
import pytest

import sparse_swa
from conftest import batch_arrays, load_case

BLOCK = 64


def mtp_builder(k):
    return sparse_swa.MetadataBuilder(dict(
        window_size=8, block_size=4, max_num_batched_tokens=16, max_num_seqs=4, max_model_len=64,
        speculative_method="mtp", num_speculative_tokens=k))


def moved_spans_step():
    """One decode token, then an 11-token draft request: 12 decode tokens (theta = 11)."""
    return (np.array([0, 1, 12], np.int32), np.array([1, 11], np.int32),
            np.arange(8, dtype=np.int32).reshape(2, 4), np.arange(12, dtype=np.int64))


def test_draft_update_with_moved_spans_reads_the_arrays():
    # The update maps the decode tokens over the query_start_loc it is given (docs/semantics.md
    # #draft-update): moved spans are followed, and nothing outside a request is read or written.
    b = mtp_builder(10)
    qsl, seq, bt, slots = moved_spans_step()
    md = b.build(qsl, seq, bt, slots)
    assert md.decode_swa_lens.tolist() == [1, 1, 2, 3, 4, 5, 6, 7, 8, 8, 8, 8]
    b.update_draft_decode_rows(md, np.array([0, 11, 12], np.int32),
                               np.array([11, 1], np.int32), bt, slots)
    assert md.decode_swa_lens.tolist() == [1, 2, 3, 4, 5, 6, 7, 8, 8, 8, 8, 1]
    assert md.token_to_req_indices.tolist() == [0] * 11 + [1]
    del md, b


def test_draft_update_after_query_start_loc_rewritten_in_place_follows_it():
    b = mtp_builder(10)
    qsl, seq, bt, slots = moved_spans_step()
    md = b.build(qsl, seq, bt, slots)
    qsl[:] = [0, 11, 12]
    seq[:] = [11, 1]
    b.update_draft_decode_metadata(md)
    assert md.decode_swa_lens.tolist() == [1, 2, 3, 4, 5, 6, 7, 8, 8, 8, 8, 1]
    # A rewrite the block table cannot hold is refused, nothing written.
    rows = md.decode_swa_indices.copy()
    seq[:] = [17, 1]
    with pytest.raises(ValueError, match=r"^block_table\[0\]: expected at least ceil"):
        b.update_draft_decode_metadata(md)
    assert np.array_equal(md.decode_swa_indices, rows)


def written_outputs_step():
    """Decodes of query lengths 1, 1, 5 (MTP k = 4, theta 5), two CUDA-graph padding tokens and
    an invalid token inside the last request."""
    qsl = np.array([0, 1, 2, 7], np.int32)
    seq = np.array([5, 9, 12], np.int32)
    bt = np.arange(48, dtype=np.int32).reshape(3, 16)
    slots = np.array([4, 24, 135, 136, -1, 138, 139, -1, -1], np.int64)
    return qsl, seq, bt, slots


def untouched_update():
    """Rows and lens of a build plus a draft update that nobody interfered with."""
    b = mtp_builder(4)
    qsl, seq, bt, slots = written_outputs_step()
    md = b.build(qsl, seq, bt, slots)
    seq += 1
    b.update_draft_decode_metadata(md)
    # Request r's pages are 16 r .. 16 r + 15: slot = 64 r + position. Positions after the
    # update: 5; 9; 8..12 (token 4 invalid); tokens 7, 8 are padding.
    assert md.decode_swa_lens.tolist() == [6, 8, 8, 8, 0, 8, 8, 0, 0]
    assert md.decode_swa_indices[0, 0].tolist() == [0, 1, 2, 3, 4, 5, -1, -1]
    assert md.decode_swa_indices[1, 0].tolist() == list(range(66, 74))
    assert md.decode_swa_indices[6, 0].tolist() == list(range(133, 141))
    return md.decode_swa_indices.copy(), md.decode_swa_lens.copy()


@pytest.mark.parametrize("value", [10**6, -5, 2])
def test_draft_update_recomputes_a_written_token_to_req_indices(value):
    rows, lens = untouched_update()
    b = mtp_builder(4)
    qsl, seq, bt, slots = written_outputs_step()
    md = b.build(qsl, seq, bt, slots)
    assert md.num_decode_tokens == 9 and md.token_to_req_indices.flags.writeable
    md.token_to_req_indices[:] = value
    seq += 1
    b.update_draft_decode_metadata(md)
    assert np.array_equal(md.decode_swa_indices, rows)
    assert np.array_equal(md.decode_swa_lens, lens)
    # From the query_start_loc; the padding tokens 7, 8 map to the last request.
    assert md.token_to_req_indices.tolist() == [0, 1, 2, 2, 2, 2, 2, 2, 2]


def test_draft_update_recomputes_a_written_is_valid_token():
    rows, lens = untouched_update()
    b = mtp_builder(4)
    qsl, seq, bt, slots = written_outputs_step()
    md = b.build(qsl, seq, bt, slots)
    md.is_valid_token[:] = True  # the invalid token 4 and the padding tokens 7, 8 included
    seq += 1
    b.update_draft_decode_metadata(md)
    assert np.array_equal(md.decode_swa_lens, lens)
    assert np.array_equal(md.decode_swa_indices, rows)
    assert (md.decode_swa_indices[[4, 7, 8]] == -1).all()
    assert md.is_valid_token.tolist() == [s >= 0 for s in slots]


@pytest.fixture
def mixed():
    case = load_case("mixed_mtp")
    return sparse_swa.MetadataBuilder(case["config"]), batch_arrays(case["batch"])


@pytest.mark.parametrize("output, name", [("decode_swa_lens", "decode_swa.lens"),
                                          ("prefill_swa_lens", "prefill_swa.lens")])
def test_a_builder_output_fed_back_as_seq_lens_is_rejected(mixed, output, name):
    b, (qsl, seq, bt, slots) = mixed
    md0 = b.build(qsl, seq, bt, slots)
    before = md0.decode_swa_indices.copy(), md0.decode_swa_lens.copy()
    fed_back = getattr(md0, output)[:3]
    with pytest.raises(ValueError, match=(
            r"^seq_lens: expected memory outside the builder's own buffers, got an array "
            rf"overlapping its {name} \(an output of a build; pass a copy\)")):
        b.build(qsl, fed_back, bt, slots)
    assert np.array_equal(md0.decode_swa_indices, before[0])
    assert np.array_equal(md0.decode_swa_lens, before[1])
    md1 = b.build(qsl, seq, bt, slots)  # the builder still works
    assert np.array_equal(md1.decode_swa_lens, before[1])


def test_a_builder_output_fed_back_to_a_draft_update_is_rejected(mixed):
    b, (qsl, seq, bt, slots) = mixed
    md = b.build(qsl, seq, bt, slots)
    with pytest.raises(ValueError, match=r"^block_table: .*overlapping its decode_swa\.data"):
        b.update_draft_decode_metadata(md, block_table=md.decode_swa_indices[:, 0, :4])


def test_host_copies_that_disagree_with_the_arrays_are_rejected(mixed):
    b, (qsl, seq, bt, slots) = mixed
    with pytest.raises(ValueError, match=(r"^query_start_loc_cpu\[1\]: expected "
                                          r"query_start_loc\[1\] = 1 .*got 2")):
        b.build(qsl, seq, bt, slots, query_start_loc_cpu=np.array([0, 2, 3, 7], np.int32),
                seq_lens_cpu=seq.copy())
    with pytest.raises(ValueError, match=(r"^seq_lens_cpu\[2\]: expected "
                                          r"seq_lens\[2\] = 10 .*got 12")):
        b.build(qsl, seq, bt, slots, seq_lens_cpu=np.array([11, 6, 12], np.int32))
    # Equal copies change nothing.
    with_copies = b.build(qsl, seq, bt, slots, query_start_loc_cpu=qsl.copy(),
                          seq_lens_cpu=seq.copy())
    rows = with_copies.prefill_swa_indices.copy(), with_copies.prefill_query_lens_cpu.copy()
    plain = b.build(qsl, seq, bt, slots)
    assert np.array_equal(plain.prefill_swa_indices, rows[0])
    assert np.array_equal(plain.prefill_query_lens_cpu, rows[1])


def test_sparse_attention_rejects_indices_below_minus_one():
    layout = sparse_swa.page_layout(BLOCK, "fp8_ds_mla", "flashmla")
    cache = np.zeros((1, layout["page_bytes"]), dtype=np.uint8)
    q = np.zeros((1, 1, 512), dtype=np.uint16)
    indices = np.array([[0, -1, -5]], dtype=np.int32)
    with pytest.raises(ValueError, match=(r"indices\[0\]\[2\]: slot -5 is below -1 "
                                          r"\(expected -1 for a hole or a slot in \[0, 64\)\)")):
        sparse_swa.sparse_attention(q, cache, BLOCK, indices, np.array([3], dtype=np.int32))
    # Past the row's length the entry is never read.
    out, lse = sparse_swa.sparse_attention(q, cache, BLOCK, indices, np.array([2], np.int32))
    assert lse.shape == (1, 1)
