"""Hostile-but-plausible input through Python (CPU backend): inputs a caller can get wrong
or write behind the library's back. Each must give a ValueError naming the field, or the result
an untouched call gives; never a crash or wrong rows."""

import numpy as np
import pytest

import sparse_swa
from conftest import batch_arrays, load_case

BLOCK = 64


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
            r"batch\.seq_lens: expected memory outside the builder's own buffers, got an array "
            rf"overlapping its {name} \(an output of a build; pass a copy\)")):
        b.build(qsl, fed_back, bt, slots)
    assert np.array_equal(md0.decode_swa_indices, before[0])
    assert np.array_equal(md0.decode_swa_lens, before[1])
    md1 = b.build(qsl, seq, bt, slots)  # the builder still works
    assert np.array_equal(md1.decode_swa_lens, before[1])


def test_a_builder_output_fed_back_to_a_draft_update_is_rejected(mixed):
    b, (qsl, seq, bt, slots) = mixed
    md = b.build(qsl, seq, bt, slots)
    with pytest.raises(ValueError, match=r"batch\.block_table: .*overlapping its decode_swa\.data"):
        b.update_draft_decode_metadata(md, block_table=md.decode_swa_indices[:, 0, :4])


def test_host_copies_that_disagree_with_the_arrays_are_rejected(mixed):
    b, (qsl, seq, bt, slots) = mixed
    with pytest.raises(ValueError, match=(r"batch\.query_start_loc_host\[1\]: expected "
                                          r"batch\.query_start_loc\[1\] = 1 .*got 2")):
        b.build(qsl, seq, bt, slots, query_start_loc_cpu=np.array([0, 2, 3, 7], np.int32),
                seq_lens_cpu=seq.copy())
    with pytest.raises(ValueError, match=(r"batch\.seq_lens_host\[2\]: expected "
                                          r"batch\.seq_lens\[2\] = 10 .*got 12")):
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
    with pytest.raises(ValueError, match=(r"swa_indices\[0\]\[2\]: slot -5 is below -1 "
                                          r"\(expected -1 for a hole or a slot in \[0, 64\)\)")):
        sparse_swa.sparse_attention(q, cache, BLOCK, indices, np.array([3], dtype=np.int32))
    # Past the row's length the entry is never read.
    out, lse = sparse_swa.sparse_attention(q, cache, BLOCK, indices, np.array([2], np.int32))
    assert lse.shape == (1, 1)
