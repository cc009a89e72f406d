# SPDX-License-Identifier: Apache-2.0
"""sparse_swa: DeepSeek-V4 sparse sliding-window attention (SWA) metadata over a paged KV cache.

A thin binding of the C++/CUDA library, a drop-in for vLLM's DeepseekSparseSWAMetadataBuilder::

    import numpy as np, sparse_swa
    builder = sparse_swa.MetadataBuilder({"window_size": 8, "block_size": 4,
                                          "max_num_batched_tokens": 64, "max_num_seqs": 8,
                                          "max_model_len": 64})
    md = builder.build(query_start_loc, seq_lens, block_table, slot_mapping)
    md.decode_swa_indices  # [num_decode_tokens, 1, decode_swa_width] int32, -1 = empty

Arrays go in through DLPack without copies (numpy, torch, cupy, jax): int32 query_start_loc,
seq_lens and block_table, int64 slot_mapping, all on one device. Host arrays run the CPU
backend; CUDA arrays run the CUDA backend and also need host copies query_start_loc_cpu and
seq_lens_cpu. Results come back in the inputs' framework and device.

Every other operation works the same way, on host or CUDA arrays (all of one call on one
device): the consumers (compressed_topk_to_global, md.mixed_matrix(), md.combined_prefill(),
to_ragged), the KV codec (encode_kv, decode_kv) and sparse_attention (SWA + compressed
segments, sinks; q torch.bfloat16 or uint16 bf16 bits: to_bf16_bits / from_bf16_bits for numpy;
out= / lse= written in place; workspace= a scratch array sized by
sparse_attention_workspace_bytes). Index arguments take the builder's [T, 1, W] arrays as they are.
Device work launches on ``stream=``: None means torch's current stream for torch tensors (so a
call inside ``torch.cuda.stream(s)`` or a graph capture lands on s), else the builder's
cuda_stream (builder calls, the metadata's consumers) or the default stream; an int
(cudaStream_t) or an object with .cuda_stream / __cuda_stream__() is used as given.
sparse_swa.dispatch tells which index widths a consumer kernel accepts (host only).

Lifetime: the metadata's arrays alias the builder's persistent buffers (fixed addresses, as CUDA
graphs need). They are valid until the builder's next build(), which overwrites them in place;
they keep the builder alive. ``md.copy()`` gives a snapshot that later builds leave alone; it
must be taken before the next build(), after which copy(), get_prefill_chunk_plan() and the
consumers (mixed_matrix, combined_prefill) raise ValueError.

Errors: invalid input raises ValueError (the message names the field, the expected and the
actual value), an unsupported combination NotImplementedError, anything else (no CUDA backend,
a CUDA error) RuntimeError. Scalars may be Python or numpy scalars (an int, never a bool, where
an int is expected; a bool, never an int, where a bool is); a value of the wrong kind (a float
for an int, None for an array, a str with NUL or a lone surrogate) is a ValueError naming the
argument, not a TypeError.
"""

from . import _sparse_swa
from ._sparse_swa import (
    BuilderConfig,
    MetadataBuilder,
    SwaMetadata,
    __version__,
    compressed_page_layout,
    compressed_topk_to_global,
    cuda_available,
    decode_kv,
    encode_kv,
    page_layout,
    sparse_attention,
    sparse_attention_workspace_bytes,
    to_ragged,
)
from .bf16 import from_bf16_bits, to_bf16_bits


class _BuildFlag:
    """A bool that is also callable: ``has_cuda_backend()`` reads like ``cuda_available()``,
    and the older attribute form ``if has_cuda_backend:`` gives the same answer."""

    __slots__ = ("_value",)

    def __init__(self, value: bool) -> None:
        self._value = bool(value)

    def __call__(self) -> bool:
        return self._value

    def __bool__(self) -> bool:
        return self._value

    def __eq__(self, other: object) -> bool:
        return self._value == other

    def __hash__(self) -> int:
        return hash(self._value)

    def __repr__(self) -> str:
        return repr(self._value)


has_cuda_backend = _BuildFlag(_sparse_swa._has_cuda_backend)
"""True when this build has the CUDA backend (a device may still be missing: see
cuda_available()). Call it, has_cuda_backend(), or test it as a bool."""

from . import dispatch  # noqa: E402  (after the names it reads)

__all__ = [
    "BuilderConfig",
    "MetadataBuilder",
    "SwaMetadata",
    "__version__",
    "compressed_page_layout",
    "compressed_topk_to_global",
    "cuda_available",
    "decode_kv",
    "encode_kv",
    "from_bf16_bits",
    "has_cuda_backend",
    "page_layout",
    "sparse_attention",
    "sparse_attention_workspace_bytes",
    "to_bf16_bits",
    "to_ragged",
]
