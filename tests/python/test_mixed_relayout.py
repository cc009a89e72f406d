# SPDX-License-Identifier: Apache-2.0
"""The mixed matrix's SM100 relayout of DSpark rows through Python
(docs/semantics.md#sm100-relayout): docs example 3 re-laid by hand through md.mixed_matrix()
and the arrays entry point the torch op calls, the verbatim form, the width bound and the other
errors as ValueErrors naming the argument, and the kernel contract on random DSpark batches.
numpy only (the torch op's own tests: test_torch_consumer_ops.py)."""

import random

import numpy as np
import pytest

import sparse_swa
import swa_model
from conftest import build_case, load_case

W = 8
REQ0 = [30, 31, 12, 13, 14, 15, 36, 37, 38, 39, 8]  # positions 2..12 of request 0
RELAID = [REQ0] * 3 + [[20, 21, 22, -1, -1, -1, -1, -1, 23, 44],
                       [20, 21, 22, 23, -1, -1, -1, -1, 44], [20, 21, 22, 23, 44]]

STEP_ARGS = ("query_start_loc", "seq_lens", "block_table", "block_size", "token_to_req_indices",
             "is_valid_token", "num_decodes", "decode_swa_indices", "decode_swa_lens",
             "prefill_swa_indices", "prefill_swa_lens", "prefill_swa_width",
             "prefill_gather_lens", "prefill_left_visible", "prefill_right_visible",
             "window_size")


def dspark_step():
    """docs/semantics.md example 3: W = 8, Wn = 64; request 0 prefix 10, request 1 prefix 2,
    three draft tokens each."""
    case = load_case("dspark_draft")
    builder = sparse_swa.MetadataBuilder(case["config"])
    return build_case(builder, case)


def step_arrays(md):
    """The arrays entry point's step arguments from host metadata (the torch op's names)."""
    args = {name: getattr(md, name) for name in STEP_ARGS}
    return dict(args, causal=md.causal, max_decode_query_len=md.max_decode_query_len)


def arrays_mixed(args, **kwargs):
    f = sparse_swa._sparse_swa._mixed_matrix_arrays
    return f(*(args[n] for n in STEP_ARGS), causal=args["causal"],
             max_decode_query_len=args["max_decode_query_len"], **kwargs)


def expect_rows(indices, want):
    for row, w in zip(np.asarray(indices).tolist(), want):
        assert row[:len(w)] == w and all(v == -1 for v in row[len(w):])


def test_example3_relaid_by_hand():
    md = dspark_step()
    assert not md.causal and md.decode_swa_width == 64
    for indices, lens, swa_lens in (md.mixed_matrix(), arrays_mixed(step_arrays(md))):
        assert indices.shape == (6, 64)
        expect_rows(indices, RELAID)
        assert lens.tolist() == [11, 11, 11, 10, 9, 8]
        assert swa_lens.tolist() == [11, 11, 11, 5, 5, 5]


def test_example3_verbatim():
    md = dspark_step()
    for indices, lens, swa_lens in (md.mixed_matrix(form="verbatim"),
                                    arrays_mixed(step_arrays(md), form="verbatim")):
        expect_rows(indices, [REQ0] * 3 + [[20, 21, 22, 23, 44]] * 3)
        assert lens.tolist() == [64] * 6 and swa_lens.tolist() == [11, 11, 11, 5, 5, 5]


def test_example3_c4a_compressed_entries_follow_the_spill():
    """Compressed block size 2, req 0 -> [3, 5], req 1 -> [8, 9]: local 0 -> 6 and 1 -> 7 for
    request 0, 0 -> 16 for request 1; P = 4, so rows are 68 wide."""
    md = dspark_step()
    local = np.array([[0, 1], [1, -1], [0, 0], [0, -1], [-1, -1], [0, 0]], np.int32)
    indices, lens, _ = md.mixed_matrix(compress_ratio=4, block_size=2, decode_local=local,
                                       block_table=np.array([[3, 5], [8, 9]], np.int32))
    assert indices.shape == (6, 68)
    expect_rows(indices, [REQ0 + [6, 7], REQ0 + [7, -1], REQ0 + [6, 6],
                          RELAID[3] + [16, -1], RELAID[4] + [-1, -1], RELAID[5] + [-1] * 3
                          + [16, 16]])
    assert lens.tolist() == [13, 12, 13, 11, 9, 10]


def test_form_must_be_known():
    md = dspark_step()
    with pytest.raises(ValueError, match=r'^form: expected "flashinfer_sm100" or "verbatim", '
                                         r"got 'sm90'"):
        md.mixed_matrix(form="sm90")
    with pytest.raises(ValueError, match=r"^form: expected a str"):
        md.mixed_matrix(form=1)


def one_block(width, lens=(5, 5, 5)):
    """One non-causal block, W = 8, identity pages, prefix 2, ql 3 (rows 0 1 2 3 4) in a decode
    view `width` wide, as arrays; max_decode_query_len 1 (the arrays' default)."""
    rows = np.full((3, width), -1, np.int32)
    rows[:, :5] = np.arange(5, dtype=np.int32)
    i32 = lambda v: np.array(v, np.int32)  # noqa: E731
    return dict(query_start_loc=i32([0, 3]), seq_lens=i32([5]), block_table=i32([[0, 1]]),
                block_size=4, token_to_req_indices=i32([0, 0, 0]),
                is_valid_token=np.ones(3, bool), num_decodes=1, decode_swa_indices=rows,
                decode_swa_lens=i32(list(lens)), prefill_swa_indices=None, prefill_swa_lens=None,
                prefill_swa_width=None, prefill_gather_lens=None, prefill_left_visible=None,
                prefill_right_visible=None, window_size=W, causal=False, max_decode_query_len=1)


def test_width_bound_names_the_width():
    """Token 0 needs W + spill = 10 SWA columns: a 9-wide view (arrays whose blocks outgrow the
    row) is a ValueError, never a write past the row; 10 columns fit."""
    with pytest.raises(ValueError, match=r"^decode_swa_indices.width: the relaid non-causal row "
                                         r"of token 0 \(request 0, query_len 3, prefix 2\) needs "
                                         r"window_size \+ spill = 8 \+ 2 = 10 SWA columns, "
                                         r"expected <= the mixed matrix's S = 9, got 10$"):
        arrays_mixed(one_block(9))
    _, lens, _ = arrays_mixed(one_block(9), form="verbatim")
    assert lens.tolist() == [9, 9, 9]
    indices, lens, swa_lens = arrays_mixed(one_block(10))
    expect_rows(indices, [[0, 1, 2, -1, -1, -1, -1, -1, 3, 4], [0, 1, 2, 3, -1, -1, -1, -1, 4],
                          [0, 1, 2, 3, 4]])
    assert lens.tolist() == [10, 9, 8] and swa_lens.tolist() == [5, 5, 5]


def test_rows_that_are_not_the_non_causal_rows_are_errors():
    with pytest.raises(ValueError, match=r"^decode_swa_lens\[0\]: expected the non-causal row's "
                                         r"min\(prefix, window_size\) \+ query_len = "
                                         r"min\(2, 8\) \+ 3 = 5, got 3$"):
        arrays_mixed(one_block(16, lens=(3, 4, 5)))
    args = one_block(16)
    args["seq_lens"] = np.array([2], np.int32)
    with pytest.raises(ValueError, match=r"^seq_lens\[0\]: expected >= query length 3, got 2$"):
        arrays_mixed(args)


@pytest.mark.parametrize("seed", range(12))
def test_random_dspark_rows_keep_the_kernel_contract(seed):
    """Random DSpark steps (W, k, prefixes, invalid tokens): every valid re-laid row has no -1
    in [0, min(W, pos + 1)) nor in [W, lens), holds exactly its request's non-causal positions,
    and -1 from lens on."""
    rng = random.Random(seed)
    w, block, k = rng.choice([4, 8, 13, 32]), rng.choice([2, 4, 16]), rng.randint(1, 5)
    theta = 1 + 2 * k
    qlens = [rng.randint(1, theta) for _ in range(rng.randint(1, 5))]
    seq = [q + rng.choice([0, 1, rng.randint(0, w), rng.randint(0, 90)]) for q in qlens]
    blocks = -(-max(seq) // block)
    bt = np.array(rng.sample(range(5000), len(seq) * blocks), np.int32).reshape(len(seq), -1)
    slots = [swa_model.slot(bt[r], block, s - q + i) if rng.random() > 0.1 else -1
             for r, (s, q) in enumerate(zip(seq, qlens)) for i in range(q)]
    config = {"window_size": w, "block_size": block, "max_num_batched_tokens": 64,
              "max_num_seqs": 8, "max_model_len": 256, "speculative_method": "dspark",
              "num_speculative_tokens": k, "parallel_drafting": True}
    md = sparse_swa.MetadataBuilder(config).build(
        np.cumsum([0] + qlens).astype(np.int32), np.array(seq, np.int32), bt,
        np.array(slots, np.int64), causal=False)
    indices, lens, _ = md.mixed_matrix()
    t = 0
    for r, (s, q) in enumerate(zip(seq, qlens)):
        ctx = s - q
        positions = list(range(max(ctx - w, 0), s))
        for i in range(q):
            row, n = indices[t].tolist(), int(lens[t])
            if slots[t] < 0:
                assert n == 0 and row == [-1] * len(row)
            else:
                wl = min(ctx + i + 1, w)
                keys = row[:wl] + row[w:n]
                assert all(v >= 0 for v in keys) and all(v == -1 for v in row[n:])
                assert keys == [swa_model.slot(bt[r], block, p) for p in positions]
            t += 1
