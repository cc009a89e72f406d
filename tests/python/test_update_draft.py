# SPDX-License-Identifier: Apache-2.0
"""update_draft_decode_metadata / update_draft_decode_rows: the draft loop's in-place recompute
of validity, the decode tokens' requests and the decode rows in the build's mode
(docs/semantics.md#draft-update): causal rows of the logical window W (never the row width) with
the build's replay_start, or DSpark non-causal rows."""

import numpy as np
import pytest

import sparse_swa
import swa_model
from conftest import batch_arrays, build_case, load_case


@pytest.fixture
def dspark():
    case = load_case("dspark_draft")
    calls = []

    def factory():
        calls.append(object())
        return calls[-1]

    builder = sparse_swa.MetadataBuilder(case["config"], tile_sched_factory=factory)
    return case, builder, calls


def test_update_after_noncausal_build_keeps_noncausal_rows(dspark):
    case, builder, calls = dspark
    md = build_case(builder, case)
    rows = md.decode_swa_indices
    assert md.decode_swa_width == 64 and not md.causal
    assert md.decode_swa_lens.tolist() == [11, 11, 11, 5, 5, 5]
    built = rows.copy()
    sched_before = md.tile_sched_swaonly
    assert sched_before is calls[-1] and md.tile_sched_c4a is None
    md.flashinfer_sparse_index_cache["layer.0"] = "stale"

    builder.update_draft_decode_metadata(md)

    # docs/semantics.md example 3: the same non-causal rows, width 64, window W = 8.
    assert md.decode_swa_width == 64
    np.testing.assert_array_equal(rows, built)
    assert md.decode_swa_lens.tolist() == [11, 11, 11, 5, 5, 5]
    assert md.tile_sched_swaonly is calls[-1] and md.tile_sched_swaonly is not sched_before
    assert md.flashinfer_sparse_index_cache == {}


def test_update_reads_seq_lens_advanced_in_place(dspark):
    case, builder, _ = dspark
    qsl, seq, bt, slots = batch_arrays(case["batch"])
    md = builder.build(qsl, seq, bt, slots, causal=False)
    seq += 1  # the engine advances seq_lens in place after accepting a token
    builder.update_draft_decode_metadata(md)
    want, lens = swa_model.rows_for_tokens(qsl.tolist(), seq.tolist(), bt.tolist(),
                                           slots.tolist(), 4, 8, range(6), noncausal=True)
    assert md.decode_swa_indices[:, 0].tolist() == [swa_model.pad(r, 64) for r in want]
    assert md.decode_swa_lens.tolist() == lens == [11, 11, 11, 6, 6, 6]


def test_update_with_explicit_arrays(dspark):
    case, builder, _ = dspark
    qsl, seq, bt, slots = batch_arrays(case["batch"])
    md = builder.build(qsl, seq, bt, slots, causal=False)
    seq2 = seq + 2
    bt2 = bt[:, ::-1].copy()  # a remapped block table
    builder.update_draft_decode_rows(md, qsl, seq2, bt2, slots)
    want, lens = swa_model.rows_for_tokens(qsl.tolist(), seq2.tolist(), bt2.tolist(),
                                           slots.tolist(), 4, 8, range(6), noncausal=True)
    assert md.decode_swa_indices[:, 0].tolist() == [swa_model.pad(r, 64) for r in want]
    assert md.decode_swa_lens.tolist() == lens
    assert md.seq_lens is seq2 and md.block_table is bt2

    # The override form records the arrays it used as well.
    seq3 = seq + 1
    builder.update_draft_decode_metadata(md, seq_lens=seq3)
    assert md.seq_lens is seq3 and md.block_table is bt2


def test_update_overrides_slot_mapping_and_query_start_loc():
    # A graph captured over a dummy batch replays over another padding: request 1 emptied, its
    # token turned padding. Validity follows slot_mapping, padding maps to the last request.
    case = load_case("padded_decode")
    builder = sparse_swa.MetadataBuilder(case["config"])
    qsl, seq, bt, slots = batch_arrays(case["batch"])
    md = builder.build(qsl, seq, bt, slots)
    assert md.token_to_req_indices.tolist() == [0, 1, 0, 0]
    qsl2 = np.array([0, 1, 1, 1, 1], np.int32)
    seq2 = np.array([4, 0, 0, 0], np.int32)
    slots2 = np.array([31, -1, -1, -1], np.int64)
    builder.update_draft_decode_metadata(md, query_start_loc=qsl2, seq_lens=seq2,
                                         slot_mapping=slots2)
    assert md.token_to_req_indices.tolist() == [0, 3, 3, 3]
    assert md.is_valid_token.tolist() == [True, False, False, False]
    assert md.decode_swa_lens.tolist() == [4, 0, 0, 0]
    assert md.decode_swa_indices[0, 0].tolist() == [28, 29, 30, 31, -1, -1, -1, -1]
    assert md.query_start_loc is qsl2 and md.slot_mapping is slots2


def test_update_accepts_host_copies_as_the_build_left_them():
    # vLLM's draft loop advances the device arrays and leaves seq_lens_cpu alone; the update
    # does not read the host copies (before: "seq_lens_cpu[0]: expected seq_lens[0] = ...").
    case = load_case("mixed_mtp")
    builder = sparse_swa.MetadataBuilder(case["config"])
    qsl, seq, bt, slots = batch_arrays(case["batch"])
    md = builder.build(qsl, seq, bt, slots, query_start_loc_cpu=qsl.copy(),
                       seq_lens_cpu=seq.copy())
    seq[:2] += 1
    builder.update_draft_decode_metadata(md)
    assert md.seq_lens_cpu.tolist() == [11, 6, 10]
    want, lens = swa_model.rows_for_tokens(qsl.tolist(), seq.tolist(), bt.tolist(),
                                           slots.tolist(), 4, 8, range(3))
    assert md.decode_swa_lens.tolist() == lens == [8, 6, 7]


def test_update_keeps_padded_rows_empty():
    case = load_case("padded_decode")
    builder = sparse_swa.MetadataBuilder(case["config"])
    qsl, seq, bt, slots = batch_arrays(case["batch"])
    md = builder.build(qsl, seq, bt, slots)
    seq[:2] += 1
    builder.update_draft_decode_metadata(md)
    assert md.decode_swa_lens.tolist() == [4, 8, 0, 0]
    assert md.decode_swa_indices[2:, 0].tolist() == [[-1] * 8, [-1] * 8]


def test_update_errors(dspark):
    case, builder, _ = dspark
    qsl, seq, bt, slots = batch_arrays(case["batch"])
    md = builder.build(qsl, seq, bt, slots, causal=False)
    with pytest.raises(ValueError, match=r"metadata: expected the metadata returned by build\(\), got a copy\(\)"):
        builder.update_draft_decode_metadata(md.copy())
    with pytest.raises(ValueError, match=r"batch: expected the shape of the last build \(2 requests, 6 tokens\), got 2 requests, 7 tokens"):
        builder.update_draft_decode_rows(md, qsl, seq, bt, np.append(slots, -1))
    bad = seq.copy()
    bad[0] = 2
    with pytest.raises(ValueError, match=r"^seq_lens\[0\]: expected >= the query length 3"):
        builder.update_draft_decode_metadata(md, seq_lens=bad)
    with pytest.raises(ValueError, match="seq_lens: expected dtype int32, got int64"):
        builder.update_draft_decode_metadata(md, seq_lens=seq.astype(np.int64))

    newer = builder.build(qsl, seq, bt, slots, causal=False)
    with pytest.raises(ValueError, match=r"metadata: expected the metadata of this builder's last build\(\) \(2 on cpu\), got build 1"):
        builder.update_draft_decode_metadata(md)
    builder.update_draft_decode_metadata(newer)
    assert newer.decode_swa_lens.tolist() == [11, 11, 11, 5, 5, 5]


def test_update_without_decode_tokens_is_a_no_op():
    case = load_case("vision_prefill")
    builder = sparse_swa.MetadataBuilder(case["config"])
    md = build_case(builder, case)
    before = md.copy()
    builder.update_draft_decode_metadata(md)
    assert md.num_decode_tokens == 0 and md.tile_schedulers == []
    np.testing.assert_array_equal(md.prefill_swa_indices, before.prefill_swa_indices)
