# SPDX-License-Identifier: Apache-2.0
"""The consumers under SWA bounded replay through Python (docs/semantics.md#bounded-replay,
#mixed-matrix, #combined-prefill-rows): docs example 6 by hand through md.mixed_matrix(),
md.combined_prefill() and the arrays entry points the torch ops call (replay_start=), errors as
ValueErrors naming the argument, and random replaying batches against swa_model. numpy only (the
torch ops' own tests: test_torch_consumer_ops.py)."""

import random

import numpy as np
import pytest

import sparse_swa
import swa_model
from conftest import build_case, load_case
from test_random_batches import random_batch, random_config

STEP_ARGS = ("query_start_loc", "seq_lens", "block_table", "block_size", "token_to_req_indices",
             "is_valid_token", "num_decodes", "decode_swa_indices", "decode_swa_lens",
             "prefill_swa_indices", "prefill_swa_lens", "prefill_swa_width",
             "prefill_gather_lens", "prefill_left_visible", "prefill_right_visible",
             "window_size")

# Example 6 (W = 8, S = 8): request 1 (replay start 8) then request 2 (replay start 12).
EX6_PREFILL = [[44], [44, 45], [44, 45, 46], [44, 45, 46, 47], [44, 45, 46, 47, 24],
               [44, 45, 46, 47, 24, 25], [4, 5, 6, 7, 16], [4, 5, 6, 7, 16, 17],
               [4, 5, 6, 7, 16, 17, 18], [4, 5, 6, 7, 16, 17, 18, 19]]
EX6_DECODE = [31, 12, 13, 14, 15, 36, 37, 38]
# Its combined prefill (one chunk (0, 2, N 0, M 13), gathered from positions 8 and 12).
EX6_COMBINED = [list(range(n)) for n in range(1, 7)] + [list(range(13, 13 + n))
                                                      for n in range(5, 9)]


def example6():
    case = load_case("replay_prefill")
    builder = sparse_swa.MetadataBuilder(case["config"])
    return builder, build_case(builder, case)


def expect_rows(indices, want):
    for row, w in zip(np.asarray(indices).tolist(), want):
        assert row[:len(w)] == w and all(v == -1 for v in row[len(w):])


def mixed_arrays(md, **kwargs):
    """_mixed_matrix_arrays over host metadata's arrays (the torch op's call)."""
    return sparse_swa._sparse_swa._mixed_matrix_arrays(
        *(getattr(md, n) for n in STEP_ARGS), causal=md.causal,
        max_decode_query_len=md.max_decode_query_len, **kwargs)


def combined_arrays(md, chunk_size=4, **kwargs):
    """(plan, rows, lens) of _combined_prefill_arrays with compress ratio 1."""
    rows = np.full((md.num_prefill_tokens, 128), -7, np.int32)
    lens = np.full(md.num_prefill_tokens, -7, np.int32)
    plan = sparse_swa._sparse_swa._combined_prefill_arrays(
        *(getattr(md, n) for n in STEP_ARGS), md.prefill_seq_lens_cpu,
        md.prefill_query_lens_cpu, md.prefill_max_model_len, md.prefill_max_num_batched_tokens,
        compress_ratio=1, chunk_size=chunk_size, out=rows, out_lens=lens, **kwargs)
    return plan, rows, lens


def test_example6_mixed_matrix():
    _, md = example6()
    assert md.replay_start.tolist() == [0, 8, 12]
    for form in ("flashinfer_sm100", "verbatim"):
        for indices, lens, swa_lens in (md.mixed_matrix(form=form),
                                        mixed_arrays(md, form=form,
                                                     replay_start=md.replay_start)):
            assert indices.shape == (11, 8)
            expect_rows(indices, [EX6_DECODE] + EX6_PREFILL)
            assert lens.tolist() == [8] * 11
            assert swa_lens.tolist() == [8, 1, 2, 3, 4, 5, 6, 5, 6, 7, 8]


def test_example6_combined_prefill():
    _, md = example6()
    chunks = md.combined_prefill(1, 4)
    assert len(chunks) == 1 and chunks[0][0] == (0, 2, 0, 13)
    _, rows, lens = chunks[0]
    expect_rows(rows, EX6_COMBINED)
    assert lens.tolist() == [1, 2, 3, 4, 5, 6, 5, 6, 7, 8]
    plan, rows, lens = combined_arrays(md, replay_start=md.replay_start)
    assert plan == [(0, 2, 0, 13, 0, 10)]
    expect_rows(rows, EX6_COMBINED)
    assert lens.tolist() == [1, 2, 3, 4, 5, 6, 5, 6, 7, 8]
    # The rows read no page: the gather lens shrunk by replay alone give the same rows.
    _, rows_without, lens_without = combined_arrays(md)
    assert np.array_equal(rows, rows_without) and np.array_equal(lens, lens_without)


def test_example6_without_the_replay_start_reads_freed_pages():
    """The arrays without replay_start (None: no replay) widen position 8's window to 1..8,
    onto request 1's freed page 0."""
    _, md = example6()
    with pytest.raises(ValueError, match=r"^block_table\[1\]\[0\]: expected a block id >= 0 "
                                         r"whose slots fit int32 \(token 1 reads positions "
                                         r"\[1, 9\)\), got -1$"):
        mixed_arrays(md)


def test_replay_start_errors_name_the_argument():
    _, md = example6()
    i32 = lambda v: np.array(v, np.int32)  # noqa: E731
    with pytest.raises(ValueError, match=r"^replay_start\[1\]: expected 0\.\.prefix "
                                         r"seq_lens\[1\] - query_len = 14 - 6 = 8, got 9$"):
        mixed_arrays(md, replay_start=i32([0, 9, 12]))
    with pytest.raises(ValueError, match=r"^replay_start\[2\]: expected 0\.\.prefix "
                                         r"seq_lens\[2\] - query_len = 20 - 4 = 16, got -1$"):
        combined_arrays(md, replay_start=i32([0, 8, -1]))
    with pytest.raises(ValueError, match=r"^replay_start: expected >= num_reqs 3 entries "
                                         r"\(or none: no replay\), got 2$"):
        mixed_arrays(md, replay_start=i32([0, 8]))
    with pytest.raises(ValueError, match=r"^replay_start: expected dtype int32"):
        mixed_arrays(md, replay_start=np.array([0, 8, 12], np.int64))
    # More entries than requests (an engine's [max_num_seqs + 1] buffer): the first R apply.
    indices, _, _ = mixed_arrays(md, replay_start=i32([0, 8, 12, 99, 99]))
    expect_rows(indices, [EX6_DECODE] + EX6_PREFILL)


def replaying_batch(rng, config, theta):
    """A random batch (test_random_batches) with a replay start in most requests and the pages
    wholly below it freed (-1); decodes of a non-causal step keep theirs (they ignore replay)."""
    (qsl, seq, bt, slots), causal = random_batch(rng, config, theta)
    bt = bt.copy()
    block = config["block_size"]
    replay = []
    for r in range(len(seq)):
        ql = int(qsl[r + 1] - qsl[r])
        prefix = int(seq[r]) - ql
        rs = 0
        if prefix > 0 and rng.random() < 0.7:
            rs = rng.choice([prefix, rng.randint(0, prefix),
                             max(0, prefix - config["window_size"] + rng.randint(-2, 2))])
        replay.append(min(rs, prefix))
        if causal or ql > theta:
            bt[r, :replay[-1] // block] = -1
    return (qsl, seq, bt, slots), causal, np.array(replay, np.int32)


@pytest.mark.parametrize("seed", range(24))
def test_random_replaying_batches(seed):
    """The mixed matrix's prefill rows are swa_model's causal rows from the replay start, the
    arrays entry points equal the metadata's methods, and each combined row is the tail of the
    token's row inside the gathered range."""
    rng = random.Random(seed)
    config, theta = random_config(rng)
    (qsl, seq, bt, slots), causal, replay = replaying_batch(rng, config, theta)
    md = sparse_swa.MetadataBuilder(config).build(qsl, seq, bt, slots, causal=causal,
                                                  replay_start=replay)
    td, w, block = md.num_decode_tokens, config["window_size"], config["block_size"]
    want, _ = swa_model.rows_for_tokens(qsl.tolist(), seq.tolist(), bt.tolist(), slots.tolist(),
                                        block, w, range(td, md.num_tokens),
                                        replay_start=replay.tolist())
    for form in ("flashinfer_sm100", "verbatim"):
        indices, lens, swa_lens = md.mixed_matrix(form=form)
        got = mixed_arrays(md, form=form, replay_start=md.replay_start)
        for a, b in zip((indices, lens, swa_lens), got):
            assert np.array_equal(a, b)
        expect_rows(indices[td:], want)
        assert swa_lens[td:].tolist() == [len(row) for row in want]
    if md.num_prefills == 0:
        return
    plan, rows, lens = combined_arrays(md, chunk_size=1, replay_start=md.replay_start)
    chunks = md.combined_prefill(1, 1)
    assert [p[:4] for p in plan] == [c[0] for c in chunks]
    for (start, end, n, m, row_start, row_end), (_, c_rows, c_lens) in zip(plan, chunks):
        assert np.array_equal(rows[row_start:row_end], c_rows)
        assert np.array_equal(lens[row_start:row_end], c_lens)
    req = md.token_to_req_indices
    for p in range(plan[-1][5]):  # the chunks' tokens (padding tokens after them are left alone)
        t = td + p
        if not md.is_valid_token[t]:
            assert lens[p] == 0
            continue
        r = int(req[t])
        b = r - md.num_decodes - next(c[0] for c in plan if c[4] <= p < c[5])
        m = next(c[3] for c in plan if c[4] <= p < c[5])
        gather_start = int(seq[r]) - int(md.prefill_gather_lens[r - md.num_decodes])
        positions = [e - m * b + gather_start for e in rows[p, :lens[p]].tolist()]
        row = want[p]
        assert [swa_model.slot(bt[r], block, q) for q in positions] == row[len(row) - lens[p]:]
        assert all(q >= replay[r] for q in positions)
