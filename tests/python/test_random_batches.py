# SPDX-License-Identifier: Apache-2.0
"""Randomized differential test: builds on random batches (MTP, DSpark draft, padding, capacity
block tables) against the independent Python model in swa_model.py, every field."""

import random

import numpy as np
import pytest

import sparse_swa
import swa_model


def random_config(rng):
    method = rng.choice(["none", "mtp", "dspark"])
    k = 0 if method == "none" else rng.randint(1, 4)
    parallel = method != "none" and rng.random() < 0.3
    window, block = rng.choice([1, 3, 8, 16]), rng.choice([1, 2, 4, 16])
    config = {"window_size": window, "block_size": block, "max_num_batched_tokens": 96,
              "max_num_seqs": 8, "max_model_len": 256, "num_speculative_tokens": k,
              "speculative_method": method, "parallel_drafting": parallel,
              "compress_ratios": rng.sample([1, 2, 4, 128], rng.randint(1, 3))}
    return config, 1 + (2 if parallel else 1) * k


def random_batch(rng, config, theta):
    block = config["block_size"]
    method = config["speculative_method"]
    num_reqs = rng.randint(0, 6)
    num_decodes = rng.randint(0, num_reqs)
    qlens = [rng.randint(1, theta) for _ in range(num_decodes)]
    qlens += [rng.randint(theta + 1, theta + 8) for _ in range(num_reqs - num_decodes)]
    seq = [q + rng.randint(0, 40) for q in qlens]
    max_blocks = max([-(-s // block) for s in seq], default=1) + rng.randint(0, 2)
    ids = rng.sample(range(4096), 8 * max_blocks)
    capacity = np.full((8, max_blocks + 3), -7, dtype=np.int32)  # engine-style capacity table
    capacity[:, :max_blocks] = np.array(ids, dtype=np.int32).reshape(8, max_blocks)
    bt = capacity[: max(num_reqs, 1), :max_blocks]  # row stride > cols: no copy
    qsl = [0]
    for q in qlens:
        qsl.append(qsl[-1] + q)
    slots = []
    for r, (s, q) in enumerate(zip(seq, qlens)):
        for i in range(q):
            valid = rng.random() > 0.1
            slots.append(swa_model.slot(bt[r], block, s - q + i) if valid else -1)
    slots += [-1] * rng.randint(0, 3)  # CUDA-graph padding
    causal = not (method == "dspark" and rng.random() < 0.6)
    return (np.array(qsl, dtype=np.int32), np.array(seq, dtype=np.int32), bt,
            np.array(slots, dtype=np.int64)), causal


def check(md, builder, config, theta, arrays, causal):
    qsl, seq, bt, slots = (a.tolist() for a in arrays)
    W, B = config["window_size"], config["block_size"]
    T = len(slots)
    rd, rp, td, tp = swa_model.split(qsl, T, theta)
    assert (md.num_decodes, md.num_prefills, md.num_decode_tokens,
            md.num_prefill_tokens) == (rd, rp, td, tp)
    qlens = [qsl[i + 1] - qsl[i] for i in range(len(seq))]
    assert md.max_decode_query_len == min(max(qlens, default=0), theta)
    assert md.token_to_req_indices.tolist() == swa_model.token_to_req(qsl, T)
    assert md.is_valid_token.tolist() == [s >= 0 for s in slots]

    width = W if causal else builder.noncausal_index_width
    assert md.decode_swa_width == width and md.decode_swa_indices.shape == (td, 1, width)
    rows, lens = swa_model.rows_for_tokens(qsl, seq, bt, slots, B, W, range(td),
                                           noncausal=not causal)
    assert md.decode_swa_indices[:, 0].tolist() == [swa_model.pad(r, width) for r in rows]
    assert md.decode_swa_lens.tolist() == lens

    if tp == 0:
        assert md.prefill_swa_indices is None and md.prefill_swa_lens is None
    else:
        rows, lens = swa_model.rows_for_tokens(qsl, seq, bt, slots, B, W, range(td, T))
        assert md.prefill_swa_indices[:, 0].tolist() == [swa_model.pad(r, W) for r in rows]
        assert md.prefill_swa_lens.tolist() == lens
    if rp == 0:
        assert md.prefill_gather_lens is None
    else:
        pre = range(rd, rd + rp)
        assert md.prefill_seq_lens_cpu.tolist() == [seq[r] for r in pre]
        assert md.prefill_query_lens_cpu.tolist() == [qlens[r] for r in pre]
        assert md.prefill_gather_lens.tolist() == [
            qlens[r] + min(seq[r] - qlens[r], W - 1) for r in pre]
    want_sched = sorted({1: "swaonly", 2: "c2a", 4: "c4a", 128: "c128a"}[c]
                        for c in config["compress_ratios"]) if td else []
    assert md.tile_schedulers == want_sched


@pytest.mark.parametrize("seed", range(8))
def test_random_batches_match_model(seed):
    rng = random.Random(seed)
    for _ in range(30):
        config, theta = random_config(rng)
        builder = sparse_swa.MetadataBuilder(config)
        # Several steps on one builder: buffers are reused, every result still exact.
        for _ in range(3):
            arrays, causal = random_batch(rng, config, theta)
            host = {}
            if rng.random() < 0.5:
                host = {"query_start_loc_cpu": arrays[0].copy(), "seq_lens_cpu": arrays[1].copy()}
            md = builder.build(*arrays, causal=causal, **host)
            check(md, builder, config, theta, arrays, causal)
