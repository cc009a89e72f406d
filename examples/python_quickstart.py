#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""sparse_swa from Python without a GPU: numpy arrays on the CPU backend, one decode + prefill
step of a small SWA layer, end to end.

    python examples/python_quickstart.py

1. a config by keyword, checked against a consumer kernel's dispatch policy;
2. the step's metadata (the reference builder's field names);
3. new K/V rows written into the paged fp8_ds_mla cache;
4. sparse attention of the decode tokens over the builder's own [T, 1, W] rows, checked against
   a plain numpy softmax over the decoded keys;
5. the same rows in CSR form (to_ragged) and the FlashInfer mixed matrix.
The same calls take torch CUDA tensors and then run on the GPU."""

import numpy as np

import sparse_swa
from sparse_swa import dispatch

W, B, HEADS = 8, 64, 4  # window, tokens per KV page, query heads

# 1. The config, checked against our own kernels' policy; the width another kernel would need.
config = sparse_swa.BuilderConfig(window_size=W, block_size=B, max_num_batched_tokens=64,
                                  max_num_seqs=4, max_model_len=256)
dispatch.validate_config(config, "sparse_swa", heads=HEADS)
sm120 = dispatch.choose_width(W, "flashinfer_sm120_decode", heads=64)
print(f"flashinfer_sm120_decode runs rows of W = {W} at width {sm120} (-1 padded)")

# 2. Two decode requests (1 new token each) then one prefill request of 5 tokens.
builder = sparse_swa.MetadataBuilder(config)
query_start_loc = np.array([0, 1, 2, 7], np.int32)
seq_lens = np.array([5, 20, 5], np.int32)
block_table = np.array([[0], [1], [2]], np.int32)  # one 64-token page each
positions = np.array([4, 19, 0, 1, 2, 3, 4])
req = np.array([0, 1, 2, 2, 2, 2, 2])
slot_mapping = (block_table[req, 0] * B + positions).astype(np.int64)
md = builder.build(query_start_loc, seq_lens, block_table, slot_mapping)
print(md)
print("decode rows", md.decode_swa_indices.shape, "lens", md.decode_swa_lens.tolist())

# 3. Every request's K/V rows (all positions up to its seq_len) into the cache.
rng = np.random.default_rng(0)
layout = sparse_swa.page_layout(B)
cache = np.zeros((3, layout["page_bytes"]), np.uint8)
slots = np.concatenate([block_table[r, 0] * B + np.arange(s) for r, s in enumerate(seq_lens)])
sparse_swa.encode_kv(cache, B, rng.standard_normal((len(slots), 512)).astype(np.float32),
                     slots.astype(np.int64))

# 4. Decode attention over the builder's rows as they are; numpy has no bfloat16: bits in uint16.
q = rng.standard_normal((md.num_decode_tokens, HEADS, 512)).astype(np.float32)
out, lse = sparse_swa.sparse_attention(sparse_swa.to_bf16_bits(q), cache, B,
                                       md.decode_swa_indices, md.decode_swa_lens)
q_used = sparse_swa.from_bf16_bits(sparse_swa.to_bf16_bits(q)).astype(np.float64)
for t in range(md.num_decode_tokens):
    keys = md.decode_swa_indices[t, 0, : md.decode_swa_lens[t]]
    k = sparse_swa.decode_kv(cache, B, keys.astype(np.int64)).astype(np.float64)
    s = q_used[t] @ k.T * 512**-0.5  # [H, keys]
    p = np.exp(s - s.max(axis=1, keepdims=True))
    want = (p / p.sum(axis=1, keepdims=True)) @ k
    got = sparse_swa.from_bf16_bits(out[t])
    assert np.allclose(got, want, rtol=2**-7, atol=1e-3), t
    print(f"token {t}: {len(keys)} keys, lse {lse[t, 0]:.3f}, matches numpy")

# 5. CSR and the mixed [T, S + P] matrix of the whole step.
indptr, flat = sparse_swa.to_ragged(md.decode_swa_indices, md.decode_swa_lens)
print("ragged indptr", indptr.tolist(), "values", flat.size)
mixed, mixed_lens, swa_lens = md.mixed_matrix()
print("mixed matrix", mixed.shape, "swa_lens", swa_lens.tolist())
