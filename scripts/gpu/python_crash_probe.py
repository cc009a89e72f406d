# SPDX-License-Identifier: Apache-2.0
"""Probe for the GPU machine: one CPU build through the Python module (a five-request prefill
batch, docs/semantics.md#example-5-more-golden-cases),
optionally after importing torch, to locate a crash; run under cuda-gdb for a native trace."""
import sys

import numpy as np

if "--torch" in sys.argv:
    import torch  # noqa: F401

import sparse_swa

config = {"window_size": 64, "block_size": 64, "max_num_batched_tokens": 128,
          "max_num_seqs": 8, "max_model_len": 1024, "compress_ratios": [1, 4]}
seq_lens, query_lens = [80, 96, 112, 128, 144], [4] * 5
qsl = np.concatenate([[0], np.cumsum(query_lens)]).astype(np.int32)
seq = np.array(seq_lens, dtype=np.int32)
bt = np.arange(5 * 3, dtype=np.int32).reshape(5, 3)
slots = np.array([bt[r][(s - q + i) // 64] * 64 + (s - q + i) % 64
                  for r, (s, q) in enumerate(zip(seq_lens, query_lens)) for i in range(q)],
                 dtype=np.int64)
print("numpy", np.__version__, "sparse_swa", sparse_swa.__file__, flush=True)
builder = sparse_swa.MetadataBuilder(config)
print("builder ok", flush=True)
md = builder.build(qsl, seq, bt, slots)
print("build ok", md.num_prefills, md.get_prefill_chunk_plan(4, 4), flush=True)
