# SPDX-License-Identifier: Apache-2.0
"""SparseSWAMetadata: one step's SWA metadata with the fields of vLLM 0.33's
DeepseekSparseSWAMetadata, in its order (the seed's fields are a subsequence)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar


@dataclass
class SparseSWAMetadata:
    """docs/semantics.md describes each field. T = num_actual_tokens (CUDA-graph padding
    included), R = num_reqs; decodes come first."""

    block_table: Any  # [R, max_blocks] int32, the batch's own tensor
    slot_mapping: Any  # [T] int64, -1 = padding (under PCP: this rank's share)
    block_size: int
    seq_lens: Any = None  # [R] int32
    query_start_loc: Any = None  # [R + 1] int32
    query_start_loc_cpu: Any = None  # [R + 1] int32, host
    is_valid_token: Any = None  # [T] bool
    token_to_req_indices: Any = None  # [T] int32
    decode_swa_indices: Any = None  # [Td, 1, decode_swa_width] int32, -1 = empty
    decode_swa_lens: Any = None  # [Td] int32
    decode_swa_width: int = 0  # window (causal) or the non-causal index width
    prefill_swa_indices: Any = None  # [Tp, 1, window + max_image_tokens] int32 or None
    prefill_swa_lens: Any = None  # [Tp] int32 or None
    prefill_left_visible: Any = None  # [T] int32 (image spans only) or None
    prefill_right_visible: Any = None  # [T] int32 (image spans only) or None
    # [R] int32 first readable position per request (bounded replay), the caller's array; the
    # builder's zeros [max_num_seqs + 1] when the caller passed none.
    replay_start: Any = None
    cache_slot_mapping: Any = None  # PCP: the gathered KV write slots, else None
    cache_positions: Any = None  # PCP: the gathered positions, else None
    num_decodes: int = 0
    num_prefills: int = 0
    num_decode_tokens: int = 0
    num_prefill_tokens: int = 0
    max_decode_query_len: int = 1
    # DeepSeek-V4.1 FlashInfer, non-causal steps: [Td] int32 max(decode_swa_lens, W) and the
    # token's request's seq_len; None otherwise.
    flashinfer_decode_topk_lens: Any = None
    flashinfer_decode_seq_lens: Any = None
    prefill_seq_lens: Any = None  # [Rp] int32
    prefill_seq_lens_cpu: Any = None  # [Rp] int32, host
    prefill_gather_lens: Any = None  # [Rp] int32
    prefill_query_lens_cpu: Any = None  # [Rp] int32, host
    prefill_window_size: int = 0
    prefill_max_model_len: int = 0
    prefill_max_num_batched_tokens: int = 0
    tile_sched_swaonly: Any = None
    tile_sched_c4a: Any = None
    tile_sched_c128a: Any = None
    tile_sched_c1a: Any = None
    tile_sched_c2a: Any = None
    flashinfer_sparse_index_cache: dict = field(default_factory=dict)

    # The sparse_swa.SwaMetadata this was made from (not a dataclass field).
    source: ClassVar[Any] = None

    def get_prefill_chunk_plan(
        self, compress_ratio: int, prefill_chunk_size: int, has_compressed: bool | None = None
    ) -> list[tuple[int, int, int, int]]:
        """(start, end, N, M) per chunk of prefill requests (docs/semantics.md#prefill-chunk-plan)."""
        if self.num_prefills == 0:
            return []
        if self.source is None:
            raise ValueError("metadata: expected metadata returned by SparseSWAMetadataBuilder."
                             "build(), got one made by hand (no chunk plan source)")
        return self.source.get_prefill_chunk_plan(compress_ratio, prefill_chunk_size,
                                                  has_compressed)
