# SPDX-License-Identifier: Apache-2.0
"""update_draft_decode_metadata / update_draft_decode_rows: the DSpark draft step's in-place
recompute of the decode rows as causal rows of the logical window W (never the row width)."""

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


def test_update_after_noncausal_build_writes_causal_rows(dspark):
    case, builder, calls = dspark
    md = build_case(builder, case)
    rows = md.decode_swa_indices
    assert md.decode_swa_width == 64 and not md.causal
    assert md.decode_swa_lens.tolist() == [11, 11, 11, 5, 5, 5]
    sched_before = md.tile_sched_swaonly
    assert sched_before is calls[-1] and md.tile_sched_c4a is None
    md.flashinfer_sparse_index_cache["layer.0"] = "stale"

    builder.update_draft_decode_metadata(md)

    # docs/semantics.md example 3: the causal rows of the same tokens.
    causal = [
        [31, 12, 13, 14, 15, 36, 37, 38],
        [12, 13, 14, 15, 36, 37, 38, 39],
        [13, 14, 15, 36, 37, 38, 39, 8],
        [20, 21, 22],
        [20, 21, 22, 23],
        [20, 21, 22, 23, 44],
    ]
    assert md.decode_swa_width == 64
    assert rows[:, 0].tolist() == [swa_model.pad(r, 64) for r in causal]
    assert md.decode_swa_lens.tolist() == [8, 8, 8, 3, 4, 5]
    assert md.tile_sched_swaonly is calls[-1] and md.tile_sched_swaonly is not sched_before
    assert md.flashinfer_sparse_index_cache == {}


def test_update_reads_seq_lens_advanced_in_place(dspark):
    case, builder, _ = dspark
    qsl, seq, bt, slots = batch_arrays(case["batch"])
    md = builder.build(qsl, seq, bt, slots, causal=False)
    seq += 1  # the engine advances seq_lens in place after accepting a token
    builder.update_draft_decode_metadata(md)
    want, lens = swa_model.rows_for_tokens(qsl.tolist(), seq.tolist(), bt.tolist(),
                                           slots.tolist(), 4, 8, range(6))
    assert md.decode_swa_indices[:, 0].tolist() == [swa_model.pad(r, 64) for r in want]
    assert md.decode_swa_lens.tolist() == lens


def test_update_with_explicit_arrays(dspark):
    case, builder, _ = dspark
    qsl, seq, bt, slots = batch_arrays(case["batch"])
    md = builder.build(qsl, seq, bt, slots, causal=False)
    seq2 = seq + 2
    bt2 = bt[:, ::-1].copy()  # a remapped block table
    builder.update_draft_decode_rows(md, qsl, seq2, bt2, slots)
    want, lens = swa_model.rows_for_tokens(qsl.tolist(), seq2.tolist(), bt2.tolist(),
                                           slots.tolist(), 4, 8, range(6))
    assert md.decode_swa_indices[:, 0].tolist() == [swa_model.pad(r, 64) for r in want]
    assert md.decode_swa_lens.tolist() == lens
    assert md.seq_lens is seq2 and md.block_table is bt2

    # The override form records the arrays it used as well.
    seq3 = seq + 1
    builder.update_draft_decode_metadata(md, seq_lens=seq3)
    assert md.seq_lens is seq3 and md.block_table is bt2


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
    assert newer.decode_swa_lens.tolist() == [8, 8, 8, 3, 4, 5]


def test_update_without_decode_tokens_is_a_no_op():
    case = load_case("vision_prefill")
    builder = sparse_swa.MetadataBuilder(case["config"])
    md = build_case(builder, case)
    before = md.copy()
    builder.update_draft_decode_metadata(md)
    assert md.num_decode_tokens == 0 and md.tile_schedulers == []
    np.testing.assert_array_equal(md.prefill_swa_indices, before.prefill_swa_indices)
