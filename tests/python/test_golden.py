# SPDX-License-Identifier: Apache-2.0
"""The golden examples (examples/batches/*.json, produced by vLLM's builder or by hand, see
docs/semantics.md#worked-examples) through Python: every field of each *.expected.json is
compared."""

import json

import numpy as np
import pytest

import sparse_swa
from conftest import EXAMPLES, build_case

CASES = sorted(p.name[: -len(".expected.json")] for p in EXAMPLES.glob("*.expected.json"))


def rows(a):
    if a is None:
        return None
    assert a.dtype == np.int32 and a.ndim == 3 and a.shape[1] == 1
    return a[:, 0, :].tolist()


def vec(a):
    return None if a is None else a.tolist()


def test_cases_found():
    assert {"mixed_mtp", "dspark_draft"} <= set(CASES)


@pytest.mark.parametrize("name", CASES)
def test_golden_case(name):
    case = json.loads((EXAMPLES / f"{name}.json").read_text())
    expected = json.loads((EXAMPLES / f"{name}.expected.json").read_text())
    builder = sparse_swa.MetadataBuilder(case["config"])
    md = build_case(builder, case)
    td = md.num_decode_tokens
    left = md.prefill_left_visible
    right = md.prefill_right_visible
    actual = {
        "num_decodes": md.num_decodes,
        "num_prefills": md.num_prefills,
        "num_decode_tokens": md.num_decode_tokens,
        "num_prefill_tokens": md.num_prefill_tokens,
        "max_decode_query_len": md.max_decode_query_len,
        "decode_swa_width": md.decode_swa_width,
        "decode_swa_indices": rows(md.decode_swa_indices),
        "decode_swa_lens": vec(md.decode_swa_lens),
        "prefill_swa_indices": rows(md.prefill_swa_indices),
        "prefill_swa_lens": vec(md.prefill_swa_lens),
        "prefill_gather_lens": vec(md.prefill_gather_lens),
        # The reference's JSON holds the prefill part of the [T] visibility arrays.
        "prefill_left_visible": None if left is None else left[td:].tolist(),
        "prefill_right_visible": None if right is None else right[td:].tolist(),
        "replay_start": vec(md.replay_start),
        "flashinfer_decode_topk_lens": vec(md.flashinfer_decode_topk_lens),
        "flashinfer_decode_seq_lens": vec(md.flashinfer_decode_seq_lens),
        "token_to_req_indices": vec(md.token_to_req_indices),
        "is_valid_token": vec(md.is_valid_token),
        "tile_schedulers": md.tile_schedulers,
        "prefill_chunk_plans": [
            {**req, "plan": [list(p) for p in md.get_prefill_chunk_plan(
                req["compress_ratio"], req["chunk_size"])]}
            for req in case.get("chunk_plan_requests", [])
        ],
    }
    assert set(expected) <= set(actual), f"fields this test does not check: {set(expected) - set(actual)}"
    for field, value in expected.items():
        assert actual[field] == value, field

    # Shapes and dtypes of the reference's tensors.
    assert md.decode_swa_indices.shape == (td, 1, md.decode_swa_width)
    assert md.decode_swa_lens.shape == (td,) and md.decode_swa_lens.dtype == np.int32
    assert md.is_valid_token.dtype == np.bool_
    assert md.token_to_req_indices.dtype == np.int32
    if md.num_prefill_tokens:
        width = builder.prefill_index_width
        assert md.prefill_swa_indices.shape == (md.num_prefill_tokens, 1, width)
    if md.num_prefills:
        assert md.prefill_seq_lens_cpu.dtype == np.int32
        assert md.prefill_seq_lens_cpu.shape == (md.num_prefills,)
        assert md.prefill_query_lens_cpu.shape == (md.num_prefills,)
        np.testing.assert_array_equal(md.prefill_seq_lens, md.seq_lens[md.num_decodes:])
    if left is not None:
        assert left.shape == (md.num_tokens,) and right.shape == (md.num_tokens,)
        assert not left[:td].any() and not right[:td].any()


def test_mixed_mtp_prefill_fields(mixed_builder, mixed_case):
    # docs/semantics.md example 1: one chunked prefill request, seq 10, query 4.
    md = build_case(mixed_builder, mixed_case)
    assert md.prefill_seq_lens_cpu.tolist() == [10]
    assert md.prefill_query_lens_cpu.tolist() == [4]
    assert md.prefill_window_size == 8
    assert md.prefill_max_model_len == 64
    assert md.prefill_max_num_batched_tokens == 64
    assert md.block_size == 4
    assert md.tile_sched_swaonly == "swaonly" and md.tile_sched_c4a == "c4a"
    assert md.tile_sched_c128a is None and md.tile_sched_c1a is None
    assert md.tile_sched_c2a is None


def test_no_prefill_fields_are_none():
    from conftest import load_case
    case = load_case("dspark_draft")
    md = build_case(sparse_swa.MetadataBuilder(case["config"]), case)
    assert md.num_prefills == 0
    for field in ("prefill_swa_indices", "prefill_swa_lens", "prefill_gather_lens",
                  "prefill_seq_lens_cpu", "prefill_query_lens_cpu", "prefill_seq_lens",
                  "prefill_left_visible", "prefill_right_visible"):
        assert getattr(md, field) is None, field
    assert md.prefill_window_size == 0 and md.prefill_max_model_len == 0
    assert md.get_prefill_chunk_plan(4, 4) == []
