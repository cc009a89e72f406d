# SPDX-License-Identifier: Apache-2.0
"""get_prefill_chunk_plan: the reference's greedy workspace plan, golden and randomized."""

import random

import numpy as np
import pytest

import sparse_swa
import swa_model


def prefill_batch(seq_lens, query_lens, block_size):
    """A prefill-only batch with identity-like block tables and consistent slots."""
    n = len(seq_lens)
    qsl = np.concatenate([[0], np.cumsum(query_lens)]).astype(np.int32)
    seq = np.array(seq_lens, dtype=np.int32)
    blocks = max(-(-s // block_size) for s in seq_lens)
    bt = np.arange(n * blocks, dtype=np.int32).reshape(n, blocks)
    slots = [swa_model.slot(bt[r], block_size, s - q + i)
             for r, (s, q) in enumerate(zip(seq_lens, query_lens)) for i in range(q)]
    return qsl, seq, bt, np.array(slots, dtype=np.int64)


def test_five_request_golden_plan():
    # docs/semantics.md example 5: seq [80..144], ql 4, W 64, max_model_len 1024, mnbt 128.
    config = {"window_size": 64, "block_size": 64, "max_num_batched_tokens": 128,
              "max_num_seqs": 8, "max_model_len": 1024, "compress_ratios": [1, 4]}
    builder = sparse_swa.MetadataBuilder(config)
    md = builder.build(*prefill_batch([80, 96, 112, 128, 144], [4] * 5, 64))
    assert md.num_prefills == 5
    assert md.get_prefill_chunk_plan(4, 4) == [(0, 5, 36, 103)]
    assert md.get_prefill_chunk_plan(4, 4, has_compressed=False) == [(0, 5, 0, 67)]
    assert md.get_prefill_chunk_plan(1, 4, True) == [(0, 5, 144, 211)]
    # A tiny area forces one request per chunk.
    assert md.get_prefill_chunk_plan(128, 1, False)[0] == (0, 2, 0, 67)


@pytest.mark.parametrize("ratio, size, message", [
    (3, 4, "chunk_plan.compress_ratio: expected a compress ratio in {1, 2, 4, 128}, got 3"),
    (4, 0, "chunk_plan.chunk_size: expected >= 1, got 0"),
])
def test_chunk_plan_errors(ratio, size, message):
    config = {"window_size": 8, "block_size": 4, "max_num_batched_tokens": 64,
              "max_num_seqs": 8, "max_model_len": 64}
    md = sparse_swa.MetadataBuilder(config).build(*prefill_batch([10], [4], 4))
    with pytest.raises(ValueError) as e:
        md.get_prefill_chunk_plan(ratio, size)
    assert str(e.value) == message


def test_random_plans_match_model():
    rng = random.Random(6)
    for _ in range(200):
        window = rng.choice([1, 4, 8, 64])
        mnbt = rng.choice([8, 32, 256])
        max_model_len = rng.choice([64, 512, 4096])
        n = rng.randint(1, 8)
        query = []
        budget = mnbt
        for _ in range(n):
            q = rng.randint(2, max(2, budget // n))
            query.append(q)
        if sum(query) > mnbt:
            continue
        seq = [q + rng.randint(0, max(0, max_model_len - q)) for q in query]
        config = {"window_size": window, "block_size": 16, "max_num_batched_tokens": mnbt,
                  "max_num_seqs": 8, "max_model_len": max_model_len}
        md = sparse_swa.MetadataBuilder(config).build(*prefill_batch(seq, query, 16))
        assert md.num_prefills == n
        for ratio in (1, 2, 4, 128):
            for chunk in (1, 2, 4):
                for has in (None, True, False):
                    want = swa_model.chunk_plan(seq, query, window, max_model_len, mnbt, ratio,
                                                chunk, has)
                    assert md.get_prefill_chunk_plan(ratio, chunk, has) == want
