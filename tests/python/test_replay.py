# SPDX-License-Identifier: Apache-2.0
"""SWA bounded replay, the FlashInfer decode lens, the decode threshold's runner rule and the
image-widening switch through Python (docs/semantics.md#bounded-replay and the sections after
it); values computed by hand or by swa_model."""

import numpy as np
import pytest

import sparse_swa
import swa_model
from conftest import batch_arrays, build_case, load_case


def golden_step():
    """docs/semantics.md#bounded-replay's example: W = 8, seq [40, 12, 30], ql [24, 12, 10],
    identity pages."""
    seq = np.array([40, 12, 30], np.int32)
    ql = [24, 12, 10]
    qsl = np.array([0, 24, 36, 46], np.int32)
    bt = np.tile(np.arange(10, dtype=np.int32), (3, 1))
    slots = np.array([p for s, q in zip(seq, ql) for p in range(s - q, s)], np.int64)
    return qsl, seq, bt, slots


def text_builder(**extra):
    return sparse_swa.MetadataBuilder(dict(
        window_size=8, block_size=4, max_num_batched_tokens=64, max_num_seqs=8,
        max_model_len=64, **extra))


def test_replay_start_clamps_rows_and_gather_lens():
    b = text_builder()
    qsl, seq, bt, slots = golden_step()
    replay = np.array([12, 0, 0], np.int32)
    md = b.build(qsl, seq, bt, slots, replay_start=replay)
    assert md.replay_start.tolist() == [12, 0, 0] and md.replay_start.dtype == np.int32
    assert md.prefill_gather_lens.tolist() == [28, 12, 17]
    assert md.prefill_swa_indices[0, 0].tolist() == [12, 13, 14, 15, 16, -1, -1, -1]
    assert md.prefill_swa_lens[:4].tolist() == [5, 6, 7, 8]
    want, lens = swa_model.rows_for_tokens(qsl.tolist(), seq.tolist(), bt.tolist(),
                                           slots.tolist(), 4, 8, range(46),
                                           replay_start=replay.tolist())
    assert md.prefill_swa_lens.tolist() == lens
    assert md.prefill_swa_indices[:, 0].tolist() == [swa_model.pad(r, 8) for r in want]
    # The chunk plan keeps the replay-free bound: 24 + 7 = 31 for request 0.
    assert md.get_prefill_chunk_plan(1, 4) == swa_model.chunk_plan(
        seq.tolist(), [24, 12, 10], 8, 64, 64, 1, 4)


def test_replay_start_defaults_to_zeros():
    b = text_builder()
    md = b.build(*golden_step())
    assert md.replay_start.tolist() == [0, 0, 0]
    assert md.prefill_gather_lens.tolist() == [31, 12, 17]


def test_replay_start_errors():
    b = text_builder()
    qsl, seq, bt, slots = golden_step()
    with pytest.raises(ValueError, match=r"^replay_start\[0\]: expected <= the request's prefix "
                                         r"seq_lens\[0\] - query_len = 40 - 24 = 16 .*got 17"):
        b.build(qsl, seq, bt, slots, replay_start=np.array([17, 0, 0], np.int32))
    with pytest.raises(ValueError, match=r"^replay_start\[2\]: expected >= 0 .*got -1"):
        b.build(qsl, seq, bt, slots, replay_start=np.array([0, 0, -1], np.int32))
    with pytest.raises(ValueError, match=r"^replay_start: expected num_reqs = 3 entries .*got 2"):
        b.build(qsl, seq, bt, slots, replay_start=np.array([0, 0], np.int32))
    with pytest.raises(ValueError, match=r"^replay_start: expected num_reqs = 3 entries .*got 0"):
        b.build(qsl, seq, bt, slots, replay_start=np.zeros(0, np.int32))
    with pytest.raises(ValueError, match=r"^replay_start: expected dtype int32, got int64"):
        b.build(qsl, seq, bt, slots, replay_start=np.zeros(3, np.int64))
    with pytest.raises(TypeError):
        b.build(qsl, seq, bt, slots, None, None, None, None, np.zeros(3, np.int32))


def test_replay_example_file():
    case = load_case("replay_prefill")
    md = build_case(sparse_swa.MetadataBuilder(case["config"]), case)
    assert md.replay_start.tolist() == [0, 8, 12]
    assert md.prefill_gather_lens.tolist() == [6, 8]
    assert md.prefill_swa_lens.tolist() == [1, 2, 3, 4, 5, 6, 5, 6, 7, 8]


def test_draft_update_keeps_the_builds_replay_start():
    b = sparse_swa.MetadataBuilder(dict(
        window_size=8, block_size=4, max_num_batched_tokens=16, max_num_seqs=4, max_model_len=64,
        speculative_method="mtp", num_speculative_tokens=1))
    qsl = np.array([0, 1, 3], np.int32)
    seq = np.array([11, 6], np.int32)
    bt = np.array([[7, 3, 9, 2], [5, 11, 6, 0]], np.int32)
    slots = np.array([38, 44, 45], np.int64)
    md = b.build(qsl, seq, bt, slots, replay_start=np.array([5, 4], np.int32))
    assert md.decode_swa_lens.tolist() == [6, 1, 2]
    seq += 1
    b.update_draft_decode_metadata(md)
    assert md.decode_swa_lens.tolist() == [7, 2, 3]
    assert md.replay_start.tolist() == [5, 4]


def dspark_config(**extra):
    case = load_case("dspark_draft")
    return case, {**case["config"], **extra}


def test_flashinfer_decode_lens():
    case, config = dspark_config(flashinfer_decode_lens=True)
    b = sparse_swa.MetadataBuilder(config)
    qsl, seq, bt, slots = batch_arrays(case["batch"])
    md = b.build(qsl, seq, bt, slots, causal=False)
    assert md.flashinfer_decode_topk_lens.tolist() == [11, 11, 11, 8, 8, 8]
    assert md.flashinfer_decode_seq_lens.tolist() == [13, 13, 13, 5, 5, 5]
    seq += 1
    b.update_draft_decode_metadata(md)
    assert md.flashinfer_decode_topk_lens.tolist() == [11, 11, 11, 8, 8, 8]
    assert md.flashinfer_decode_seq_lens.tolist() == [14, 14, 14, 6, 6, 6]
    causal = b.build(qsl, seq, bt, slots, causal=True)
    assert causal.flashinfer_decode_topk_lens is None
    assert causal.flashinfer_decode_seq_lens is None
    plain = sparse_swa.MetadataBuilder(case["config"]).build(qsl, seq, bt, slots, causal=False)
    assert plain.flashinfer_decode_topk_lens is None


def test_decode_threshold_follows_the_model_runner():
    _, config = dspark_config(parallel_drafting=True)  # k = 3
    assert sparse_swa.MetadataBuilder(config).decode_threshold == 7
    v2 = sparse_swa.MetadataBuilder({**config, "model_runner_v2": True})
    assert v2.decode_threshold == 4
    assert v2.config.model_runner_v2 is True
    with pytest.raises(ValueError, match="config.model_runner_v2"):
        sparse_swa.BuilderConfig(model_runner_v2="yes")


def test_vision_v41_config_does_not_widen():
    case = load_case("vision_prefill")
    config = {**case["config"], "widen_image_spans": False}
    b = sparse_swa.MetadataBuilder(config)
    assert b.prefill_index_width == config["window_size"]
    md = build_case(b, case)
    assert md.prefill_left_visible is None and md.prefill_right_visible is None
    assert md.prefill_swa_indices.shape[2] == config["window_size"]
    qsl, seq, bt, slots = batch_arrays(case["batch"])
    _, lens = swa_model.rows_for_tokens(qsl.tolist(), seq.tolist(), bt.tolist(),
                                        slots.tolist(), config["block_size"],
                                        config["window_size"], range(len(slots)))
    assert md.prefill_swa_lens.tolist() == lens
