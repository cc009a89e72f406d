# SPDX-License-Identifier: Apache-2.0
"""Type stubs for sparse_swa (see __init__.py for the array and lifetime rules). Where an int,
bool or float is annotated, the numpy scalar of that kind is taken too."""

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from . import dispatch as dispatch

__version__: str

class _BuildFlag:
    """A bool that is also callable (has_cuda_backend() and `if has_cuda_backend:` agree)."""

    def __call__(self) -> bool: ...
    def __bool__(self) -> bool: ...

has_cuda_backend: _BuildFlag  # this build has the CUDA backend (a device may still be missing)

def cuda_available() -> bool:
    """True when this build has the CUDA backend and a CUDA device is usable."""

def to_bf16_bits(x: Any) -> np.ndarray:
    """float32 values -> bf16 bit patterns (uint16), round to nearest even; NaN stays NaN."""

def from_bf16_bits(bits: Any) -> np.ndarray:
    """bf16 bit patterns (uint16) -> float32 values (exact)."""

class BuilderConfig:
    """Builder configuration with the JSON config's field names; validated by MetadataBuilder."""

    window_size: int
    block_size: int
    max_num_batched_tokens: int
    max_num_seqs: int
    max_model_len: int
    num_speculative_tokens: int
    speculative_method: str  # "none" | "mtp" | "dspark"
    parallel_drafting: bool
    model_runner_v2: bool  # theta = 1 + k even with parallel_drafting
    max_image_tokens: int
    widen_image_spans: bool  # False: DeepSeek-V4.1 vision, plain causal windows of width W
    compress_ratios: list[int]  # each in {1, 2, 4, 128}; empty means [1]
    noncausal_index_width: int  # DSpark row width; 0 derives it (dispatch.choose_noncausal_width)
    flashinfer_decode_lens: bool  # write flashinfer_decode_* on non-causal steps
    def __init__(self, **fields: Any) -> None: ...
    @staticmethod
    def from_dict(config: Mapping[str, Any]) -> BuilderConfig: ...
    def to_dict(self) -> dict[str, Any]: ...

# Any DLPack producer: numpy.ndarray, torch.Tensor, cupy.ndarray, jax.Array.
Array = Any
# None (torch's current stream for torch tensors, else the default), an int cudaStream_t, or an
# object with .cuda_stream (torch.cuda.Stream, cupy Stream) or __cuda_stream__().
Stream = Any
ChunkPlan = list[tuple[int, int, int, int]]
ImageSpans = Mapping[int, Sequence[tuple[int, int]]]

class SwaMetadata:
    """One step's metadata; arrays alias the builder's buffers until its next build()."""

    num_decodes: int
    num_prefills: int
    num_decode_tokens: int
    num_prefill_tokens: int
    num_reqs: int
    num_tokens: int
    max_decode_query_len: int
    decode_swa_width: int
    causal: bool
    block_size: int
    window_size: int  # W, also on steps without prefill tokens
    prefill_swa_width: int  # W + max_image_tokens, also on steps without prefill tokens
    backend: str | None  # "cpu" | "cuda"; None for a copy()
    is_current: bool
    decode_swa_indices: Array  # [num_decode_tokens, 1, decode_swa_width] int32, -1 = empty
    decode_swa_lens: Array  # [num_decode_tokens] int32
    prefill_swa_indices: Array | None  # [num_prefill_tokens, 1, W + max_image_tokens] int32
    prefill_swa_lens: Array | None  # [num_prefill_tokens] int32
    prefill_left_visible: Array | None  # [num_tokens] int32 (image path only)
    prefill_right_visible: Array | None  # [num_tokens] int32 (image path only)
    prefill_gather_lens: Array | None  # [num_prefills] int32
    replay_start: Array  # [num_reqs] int32, zeros when the build had no replay_start
    flashinfer_decode_topk_lens: Array | None  # [num_decode_tokens] int32, non-causal steps
    flashinfer_decode_seq_lens: Array | None  # [num_decode_tokens] int32, non-causal steps
    prefill_seq_lens_cpu: Array | None  # [num_prefills] int32, host
    prefill_query_lens_cpu: Array | None  # [num_prefills] int32, host
    prefill_seq_lens: Array | None  # seq_lens[num_decodes:]
    prefill_window_size: int
    prefill_max_model_len: int
    prefill_max_num_batched_tokens: int
    token_to_req_indices: Array  # [num_tokens] int32
    is_valid_token: Array  # [num_tokens] bool
    query_start_loc: Array
    query_start_loc_cpu: Array | None
    seq_lens: Array
    seq_lens_cpu: Array | None
    block_table: Array
    slot_mapping: Array
    tile_schedulers: list[str]
    tile_sched_swaonly: Any | None
    tile_sched_c4a: Any | None
    tile_sched_c128a: Any | None
    tile_sched_c1a: Any | None
    tile_sched_c2a: Any | None
    flashinfer_sparse_index_cache: dict[Any, Any]
    def get_prefill_chunk_plan(
        self,
        compress_ratio: int,
        prefill_chunk_size: int,
        has_compressed: bool | None = None,
    ) -> ChunkPlan:
        """(start, end, N, M) per chunk of prefill requests; ValueError on a bad ratio/size
        or when a later build() made this metadata stale (is_current False)."""
    def copy(self) -> SwaMetadata:
        """A snapshot with owned array copies; later builds leave it alone. ValueError when a
        later build() already made this metadata stale (is_current False)."""
    def mixed_matrix(
        self,
        *,
        compress_ratio: int = 1,
        block_table: Array | None = None,
        block_size: int | None = None,
        decode_local: Array | None = None,
        decode_global: Array | None = None,
        decode_global_lens: Array | None = None,
        prefill_local: Array | None = None,
        form: str = "flashinfer_sm100",
        stream: Stream = None,
    ) -> tuple[Array, Array, Array]:
        """The mixed matrix of one layer as new arrays where the metadata lives: (indices
        [T, row_width] int32, lens [T] int32, swa_lens [T] int32). SWA-only by default; a
        compressed layer passes its compressed block_table / block_size and top-k (decode_local
        for C2A/C4A or decode_global + decode_global_lens for C128A, prefill_local). form
        "flashinfer_sm100" re-lays DSpark decode rows for the SM100 kernel (ValueError when a
        row would need more than its S SWA columns), "verbatim" copies them. Prefill rows start
        no earlier than the build's replay_start."""
    def combined_prefill(
        self,
        compress_ratio: int = 1,
        chunk_size: int = 4,
        *,
        prefill_local: Array | None = None,
        stream: Stream = None,
    ) -> list[tuple[tuple[int, int, int, int], Array, Array]]:
        """FlashMLA prefill rows per chunk: ((start, end, N, M), rows [n, width] int32, lens [n]
        int32), where the metadata lives; a compressed layer passes prefill_local [>= Tp,
        TOP_K]. SWA windows start no earlier than the build's replay_start."""

class MetadataBuilder:
    """The per-step SWA metadata builder (CPU backend for host arrays, CUDA for device)."""

    def __init__(
        self,
        config: Mapping[str, Any] | BuilderConfig,
        *,
        device: str | None = None,
        cuda_stream: int = 0,
        tile_sched_factory: Callable[[], Any] | None = None,
    ) -> None: ...
    def build(
        self,
        query_start_loc: Array,
        seq_lens: Array,
        block_table: Array,
        slot_mapping: Array,
        causal: bool = True,
        image_spans: ImageSpans | None = None,
        query_start_loc_cpu: Array | None = None,
        seq_lens_cpu: Array | None = None,
        *,
        replay_start: Array | None = None,
        stream: Stream = None,
    ) -> SwaMetadata:
        """replay_start: [num_reqs] int32 beside the arrays, 0 <= replay_start[r] <= the
        request's prefix (SWA bounded replay); None = zeros."""
    @staticmethod
    def build_groups(
        builders: Sequence[MetadataBuilder],
        query_start_loc: Array,
        seq_lens: Array,
        block_tables: Sequence[Array],
        slot_mappings: Sequence[Array],
        causal: bool = True,
        image_spans: ImageSpans | None = None,
        query_start_loc_cpu: Array | None = None,
        seq_lens_cpu: Array | None = None,
        *,
        replay_starts: Sequence[Array | None] | None = None,
        stream: Stream = None,
    ) -> list[SwaMetadata]:
        """Several KV-cache groups of one step: entry g is builders[g].build(...,
        block_tables[g], slot_mappings[g], replay_start=replay_starts[g]); all checked before any
        is written, one kernel launch on cuda arrays."""
    def update_draft_decode_metadata(
        self,
        metadata: SwaMetadata,
        *,
        seq_lens: Array | None = None,
        block_table: Array | None = None,
        slot_mapping: Array | None = None,
        query_start_loc: Array | None = None,
        query_start_loc_cpu: Array | None = None,
        seq_lens_cpu: Array | None = None,
        stream: Stream = None,
    ) -> None:
        """Validity from slot_mapping, the decode tokens' requests from query_start_loc
        (padding: the last request), decode rows in the build's mode with its replay_start.
        None = the build's array; the *_cpu host copies are not read."""
    def update_draft_decode_rows(
        self,
        metadata: SwaMetadata,
        query_start_loc: Array,
        seq_lens: Array,
        block_table: Array,
        slot_mapping: Array,
        query_start_loc_cpu: Array | None = None,
        seq_lens_cpu: Array | None = None,
        *,
        stream: Stream = None,
    ) -> None: ...
    @property
    def config(self) -> BuilderConfig: ...
    @property
    def decode_threshold(self) -> int: ...
    @property
    def prefill_index_width(self) -> int: ...
    @property
    def noncausal_index_width(self) -> int: ...
    @property
    def layer_types(self) -> list[str]: ...
    @property
    def cuda_stream(self) -> int: ...
    @property
    def backends(self) -> list[str]: ...

def to_ragged(indices: Array, lens: Array, *, stream: Stream = None) -> tuple[Array, Array]:
    """indices [rows, width] or [rows, 1, width] int32 + lens [rows] int32 -> (indptr [rows + 1]
    int32, flat int32): host flat is [indptr[-1]]; device flat has capacity rows x width, valid
    prefix indptr[-1]. rows x width <= 2**31 - 1."""

def page_layout(
    block_size: int, dtype: str = "fp8_ds_mla", consumer: str = "flashmla"
) -> dict[str, Any]:
    """The SWA cache page layout (block_size a positive multiple of 32): block_size,
    compress_ratio (1), dtype, consumer, head_size, token_bytes, content_bytes, alignment,
    page_bytes."""

def compressed_page_layout(
    attn_block_size: int,
    compress_ratio: int,
    dtype: str = "fp8_ds_mla",
    consumer: str = "flashmla",
) -> dict[str, Any]:
    """A compressed cache's page layout (C2A, C4A, C128A), as page_layout's: pages of
    attn_block_size // compress_ratio entries (256 // 4 = 64 for C4A, 256 // 128 = 2 for C128A);
    compress_ratio 2, 4 or 128, attn_block_size a positive multiple of 32 and of the ratio."""

def encode_kv(
    cache: Array,
    block_size: int,
    rows: Array,
    slots: Array,
    dtype: str = "fp8_ds_mla",
    *,
    stream: Stream = None,
) -> None:
    """Writes rows [n, 512] (float32, bfloat16 or uint16 bf16 bits) into the uint8 cache
    [num_blocks, page_bytes] at slots [n] int64 (-1 = skip), in place; host arrays on the CPU,
    CUDA arrays on the GPU. The row stride is the page stride; the columns must hold a page's
    content (content_bytes), else ValueError (decode_kv, sparse_attention alike)."""

def decode_kv(
    cache: Array,
    block_size: int,
    slots: Array,
    dtype: str = "fp8_ds_mla",
    *,
    out: Array | None = None,
    stream: Stream = None,
) -> Array:
    """Reads slots [n] int64 back -> float32 [n, 512] (slot -1: zeros), into out when given."""

def sparse_attention(
    q: Array,
    swa_cache: Array,
    swa_block_size: int,
    indices: Array,
    lens: Array,
    scale: float | None = None,
    sinks: Array | None = None,
    dtype: str = "fp8_ds_mla",
    *,
    extra_cache: Array | None = None,
    extra_block_size: int | None = None,
    extra_indices: Array | None = None,
    extra_lens: Array | None = None,
    out: Array | None = None,
    lse: Array | None = None,
    stream: Stream = None,
    kernel: str = "auto",
    query_group_size: int = 1,
    workspace: Array | None = None,
) -> tuple[Array, Array]:
    """Sparse MLA attention over the SWA segment (+ the optional compressed extra_* segment):
    q [T, H, 512] bfloat16 (or uint16 bf16 bits), indices [T, W] or [T, 1, W] int32, lens [T]
    int32 -> (out [T, H, 512] of q's dtype, lse [T, H] float32, +inf for a row without keys).
    Host arrays: the CPU reference; CUDA arrays: the CUDA kernels on `stream`. kernel: "auto",
    or "sm90_tile32" / "sm90_pairs" to force a family of the sm_90a tensor-core kernels
    (ignored for host arrays).
    query_group_size (1..8): a hint that each g consecutive rows are tokens of one request whose
    keys overlap (MTP / DSpark), so that the CUDA kernel may load shared keys once.
    workspace: a writable contiguous uint8 array on q's device (16-byte aligned) used as the
    call's scratch, sized by sparse_attention_workspace_bytes; None = the module's cached
    split-KV workspace."""

def sparse_attention_workspace_bytes(
    q: Array,
    swa_cache: Array,
    swa_block_size: int,
    indices: Array,
    lens: Array,
    dtype: str = "fp8_ds_mla",
    *,
    extra_cache: Array | None = None,
    extra_block_size: int | None = None,
    extra_indices: Array | None = None,
    extra_lens: Array | None = None,
    kernel: str = "auto",
    query_group_size: int = 1,
) -> int:
    """The workspace bytes sparse_attention with these arguments would use on the current device
    (split keys, query groups, decoded keys), from shapes only; 0 for host arrays or when the
    call needs none."""

def compressed_topk_to_global(
    metadata: SwaMetadata,
    first_token: int,
    local: Array,
    block_table: Array,
    block_size: int,
    compress_ratio: int,
    *,
    out: Array | None = None,
    out_lens: Array | None = None,
    stream: Stream = None,
) -> tuple[Array, Array]:
    """Compressed top-k local [n, topk] int32 of tokens first_token.. -> (global slots [n, topk]
    int32, -1 = none, lens [n] int32), where the metadata lives."""
