# SPDX-License-Identifier: Apache-2.0
"""A drop-in for vLLM's DeepSeek-V4 SWA metadata builder (DeepseekSparseSWAMetadataBuilder),
backed by sparse_swa.MetadataBuilder: the CUDA backend for CUDA tensors, the CPU one for host
tensors. README.md#using-it-from-vllm shows how an engine switches to it.

    builder = SparseSWAMetadataBuilder(kv_cache_spec, layer_names, vllm_config, device)
    md = builder.build(common_prefix_len, common_attn_metadata)   # a SparseSWAMetadata

The constructor reads what vLLM's builder reads: kv_cache_spec.block_size; from vllm_config
model_config.max_model_len, model_config.hf_config (sliding_window, compress_ratios,
vision_max_n_token, vision_n_layers), scheduler_config (max_num_batched_tokens, max_num_seqs)
and speculative_config (num_speculative_tokens, parallel_drafting, use_dspark()). build() reads
from common_attn_metadata: query_start_loc(_cpu), seq_lens, seq_lens_cpu_upper_bound,
block_table_tensor, slot_mapping, causal, max_query_len and mm_req_doc_ranges.

vLLM is not a dependency: it is imported only for what it provides when present (the base
builder class, AttentionCGSupport, get_mla_metadata for the tile_sched_* holders and the
platform checks). Without vLLM the tile_sched_* fields hold the layer type's name.

Lifetime (as vLLM's builder): the metadata's index arrays alias the builder's persistent
buffers and are rewritten by its next build(); get_prefill_chunk_plan() must be called before
that next build (it raises ValueError after).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Mapping

import sparse_swa

LAYER_TYPES = ("swaonly", "c4a", "c128a", "c1a", "c2a")


def _vllm_attr(module: str, name: str, default: Any = None) -> Any:
    """vllm's `module.name`, or default when vLLM (or that name) is not there."""
    try:
        return getattr(importlib.import_module(module), name, default)
    except ImportError:
        return default


_BUILDER_BASE = _vllm_attr("vllm.v1.attention.backend", "AttentionMetadataBuilder", object)
_CG_SUPPORT = _vllm_attr("vllm.v1.attention.backend", "AttentionCGSupport")


@dataclass
class SparseSWAMetadata:
    """One step's SWA metadata, with the field names, order and types of vLLM's
    DeepseekSparseSWAMetadata (docs/semantics.md describes each field). T = num_actual_tokens
    (CUDA-graph padding included), R = num_reqs; decodes come first."""

    block_table: Any  # [R, max_blocks] int32, the batch's own tensor
    slot_mapping: Any  # [T] int64, -1 = padding
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
    num_decodes: int = 0
    num_prefills: int = 0
    num_decode_tokens: int = 0
    num_prefill_tokens: int = 0
    max_decode_query_len: int = 1
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
        """(start, end, N, M) per chunk of prefill requests (docs/semantics.md#chunk-plan)."""
        if self.num_prefills == 0:
            return []
        if self.source is None:
            raise ValueError("metadata: expected metadata returned by SparseSWAMetadataBuilder."
                             "build(), got one made by hand (no chunk plan source)")
        return self.source.get_prefill_chunk_plan(compress_ratio, prefill_chunk_size,
                                                  has_compressed)


def builder_config(kv_cache_spec: Any, vllm_config: Any) -> dict[str, Any]:
    """The sparse_swa builder config (JSON field names) for vLLM's kv_cache_spec and
    vllm_config, read as vLLM's builder reads them."""
    hf = vllm_config.model_config.hf_config
    spec = vllm_config.speculative_config
    k = int(spec.num_speculative_tokens) if spec is not None else 0
    if spec is None:
        method = "none"
    else:
        use_dspark = getattr(spec, "use_dspark", None)
        method = "dspark" if callable(use_dspark) and use_dspark() else "mtp"
    vision_layers = getattr(hf, "vision_n_layers", 0) or 0
    max_image_tokens = int(getattr(hf, "vision_max_n_token", 0) or 0) if vision_layers > 0 else 0
    # vLLM treats a ratio <= 1 as an SWA-only layer.
    ratios = [max(int(r), 1) for r in (getattr(hf, "compress_ratios", None) or [1])]
    scheduler = vllm_config.scheduler_config
    return {
        "window_size": int(hf.sliding_window),
        "block_size": int(kv_cache_spec.block_size),
        "max_num_batched_tokens": int(scheduler.max_num_batched_tokens),
        "max_num_seqs": int(scheduler.max_num_seqs),
        "max_model_len": int(vllm_config.model_config.max_model_len),
        "num_speculative_tokens": k,
        "speculative_method": method,
        "parallel_drafting": bool(spec is not None and getattr(spec, "parallel_drafting", False)),
        "max_image_tokens": max_image_tokens,
        "compress_ratios": sorted(set(ratios)),
    }


def _tile_sched_source() -> tuple[bool, Callable[[], Any] | None]:
    """(whether this platform uses FlashMLA plan holders, vLLM's factory of an empty one).
    vLLM uses none on ROCm, XPU and SM12x; without vLLM the factory is None."""
    platform = _vllm_attr("vllm.platforms", "current_platform")
    if platform is not None and (platform.is_rocm() or platform.is_xpu()
                                 or platform.is_device_capability_family(120)):
        return False, None
    get_mla_metadata = _vllm_attr("vllm.v1.attention.ops.flashmla", "get_mla_metadata")
    if get_mla_metadata is None:
        return True, None
    return True, lambda: get_mla_metadata()[0]


class SparseSWAMetadataBuilder(_BUILDER_BASE):
    """vLLM's DeepseekSparseSWAMetadataBuilder interface over sparse_swa.MetadataBuilder."""

    reorder_batch_threshold: int | None = None
    _cudagraph_support: ClassVar[Any] = getattr(_CG_SUPPORT, "UNIFORM_BATCH", None)
    supports_draft_decode_metadata_update = True

    def __init__(self, kv_cache_spec: Any, layer_names: list[str], vllm_config: Any,
                 device: Any) -> None:
        if _BUILDER_BASE is object:
            self.kv_cache_spec, self.layer_names = kv_cache_spec, layer_names
            self.vllm_config, self.device = vllm_config, device
        else:
            super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.sparse_swa_config = builder_config(kv_cache_spec, vllm_config)
        c = self.sparse_swa_config
        self.head_size = getattr(kv_cache_spec, "head_size", 512)
        self.block_size = c["block_size"]
        self.window_size = c["window_size"]
        self.max_model_len = c["max_model_len"]
        self.max_num_batched_tokens = c["max_num_batched_tokens"]
        self.num_speculative_tokens = c["num_speculative_tokens"]
        self.max_image_tokens = c["max_image_tokens"]
        self.is_dspark = c["speculative_method"] == "dspark"
        self.reorder_batch_threshold = None

        self._tile_sched_enabled, factory = _tile_sched_source()
        self._tile_sched_factory = factory
        device_type = getattr(device, "type", str(device).split(":")[0])
        if device_type == "cuda":
            import torch  # the engine's own; only CUDA builders need it here

            with torch.cuda.device(device):  # the CUDA backend takes the current device
                self._builder = sparse_swa.MetadataBuilder(c, device="cuda",
                                                           tile_sched_factory=factory)
        else:
            self._builder = sparse_swa.MetadataBuilder(c, device="cpu",
                                                       tile_sched_factory=factory)
        self.decode_threshold = self._builder.decode_threshold
        self.prefill_index_width = self._builder.prefill_index_width
        self.noncausal_index_width = self._builder.noncausal_index_width if self.is_dspark else 0

    @property
    def sparse_swa_builder(self) -> sparse_swa.MetadataBuilder:
        """The sparse_swa.MetadataBuilder underneath (its buffers back every metadata)."""
        return self._builder

    def build(self, common_prefix_len: int, common_attn_metadata: Any,
              fast_build: bool = False) -> SparseSWAMetadata:
        """The step's metadata; common_prefix_len and fast_build are accepted and unused, as
        in vLLM's builder."""
        cm = common_attn_metadata
        spans = None
        if self.max_image_tokens > 0:
            ranges = getattr(cm, "mm_req_doc_ranges", None)
            if ranges and any(ranges.values()):
                spans = ranges
        seq_cpu = getattr(cm, "seq_lens_cpu_upper_bound", None)
        if seq_cpu is None:
            seq_cpu = getattr(cm, "seq_lens_cpu", None)
        md = self._builder.build(cm.query_start_loc, cm.seq_lens, cm.block_table_tensor,
                                 cm.slot_mapping, causal=bool(getattr(cm, "causal", True)),
                                 image_spans=spans, query_start_loc_cpu=cm.query_start_loc_cpu,
                                 seq_lens_cpu=seq_cpu)
        return self._metadata(md, cm)

    def build_for_cudagraph_capture(self, common_attn_metadata: Any) -> SparseSWAMetadata:
        return self.build(0, common_attn_metadata)

    def update_draft_decode_metadata(self, metadata: SparseSWAMetadata) -> None:
        """After the engine advanced seq_lens (and block_table) in place: recompute the decode
        rows as causal rows of the window, in place (CUDA-graph capture safe), new plan holders,
        cleared FlashInfer cache."""
        if metadata.num_decode_tokens == 0:
            return
        src = metadata.source
        if src is None:
            raise ValueError("metadata: expected metadata returned by this builder's build()")
        self._builder.update_draft_decode_metadata(src, seq_lens=metadata.seq_lens,
                                                   block_table=metadata.block_table)
        self._copy_tile_sched(src, metadata)
        metadata.flashinfer_sparse_index_cache.clear()

    def build_tile_scheduler(self, num_decode_tokens: int) -> dict[str, Any]:
        """One fresh plan holder per present layer type (None for the others, and for all when
        there are no decode tokens or this platform uses none)."""
        if num_decode_tokens == 0 or not self._tile_sched_enabled:
            return {t: None for t in LAYER_TYPES}
        present, make = set(self._builder.layer_types), self._tile_sched_factory
        return {t: (make() if make else t) if t in present else None for t in LAYER_TYPES}

    def _copy_tile_sched(self, src: Any, out: SparseSWAMetadata) -> None:
        for t in LAYER_TYPES:
            setattr(out, f"tile_sched_{t}",
                    getattr(src, f"tile_sched_{t}") if self._tile_sched_enabled else None)

    def _metadata(self, md: Any, cm: Any) -> SparseSWAMetadata:
        out = SparseSWAMetadata(
            block_table=cm.block_table_tensor,
            slot_mapping=cm.slot_mapping,
            block_size=self.block_size,
            seq_lens=cm.seq_lens,
            query_start_loc=cm.query_start_loc,
            query_start_loc_cpu=cm.query_start_loc_cpu,
            is_valid_token=md.is_valid_token,
            token_to_req_indices=md.token_to_req_indices,
            decode_swa_indices=md.decode_swa_indices,
            decode_swa_lens=md.decode_swa_lens,
            decode_swa_width=md.decode_swa_width,
            prefill_swa_indices=md.prefill_swa_indices,
            prefill_swa_lens=md.prefill_swa_lens,
            prefill_left_visible=md.prefill_left_visible,
            prefill_right_visible=md.prefill_right_visible,
            num_decodes=md.num_decodes,
            num_prefills=md.num_prefills,
            num_decode_tokens=md.num_decode_tokens,
            num_prefill_tokens=md.num_prefill_tokens,
            # vLLM's hint: the batch's max query length, capped by the decode threshold.
            max_decode_query_len=min(int(cm.max_query_len), self.decode_threshold),
            prefill_seq_lens=md.prefill_seq_lens,
            prefill_seq_lens_cpu=md.prefill_seq_lens_cpu,
            prefill_gather_lens=md.prefill_gather_lens,
            prefill_query_lens_cpu=md.prefill_query_lens_cpu,
            prefill_window_size=md.prefill_window_size,
            prefill_max_model_len=md.prefill_max_model_len,
            prefill_max_num_batched_tokens=md.prefill_max_num_batched_tokens,
        )
        self._copy_tile_sched(md, out)
        out.source = md
        return out


# The batch fields two KV-cache groups must share to share one build.
_BATCH_FIELDS = ("query_start_loc", "seq_lens", "block_table_tensor", "slot_mapping")


def _same_tensor(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        return (a.data_ptr() == b.data_ptr() and a.device == b.device and a.dtype == b.dtype
                and tuple(a.shape) == tuple(b.shape) and tuple(a.stride()) == tuple(b.stride()))
    except AttributeError:
        return False


def _batch_difference(a: Any, b: Any) -> str | None:
    """The first field in which two groups' common metadata differ, or None."""
    for name in _BATCH_FIELDS:
        if not _same_tensor(getattr(a, name), getattr(b, name)):
            return name
    for name in ("causal", "num_actual_tokens", "num_reqs", "max_query_len"):
        if getattr(a, name, None) != getattr(b, name, None):
            return name
    return None


class SharedSWAMetadataBuilds:
    """One builder per (window, block size, device) for all the KV-cache groups that share
    them, and one build per step for all of them: each group gets the same metadata.

        shared = SharedSWAMetadataBuilds()
        for gid, (spec, layers) in groups.items():
            shared.add_group(gid, spec, layers, vllm_config, device)
        per_group = shared.build(common_prefix_len, {gid: common_attn_metadata, ...})

    Groups of one key must hand in the same batch (the same query_start_loc, seq_lens,
    block_table_tensor and slot_mapping tensors, or views of the same memory); a group whose
    batch differs raises ValueError naming it and the field.
    """

    def __init__(self) -> None:
        self._builders: dict[tuple, SparseSWAMetadataBuilder] = {}
        self._key_of: dict[Any, tuple] = {}

    def add_group(self, group_id: Any, kv_cache_spec: Any, layer_names: list[str],
                  vllm_config: Any, device: Any) -> SparseSWAMetadataBuilder:
        """Registers a KV-cache group; returns the builder it shares (made at the first group
        of its key). ValueError when a group of the same key has another configuration."""
        if group_id in self._key_of:
            raise ValueError(f"group_id: expected a new group, got {group_id!r} again")
        config = builder_config(kv_cache_spec, vllm_config)
        key = (config["window_size"], config["block_size"], str(device))
        builder = self._builders.get(key)
        if builder is None:
            builder = SparseSWAMetadataBuilder(kv_cache_spec, list(layer_names), vllm_config,
                                               device)
            self._builders[key] = builder
        elif builder.sparse_swa_config != config:
            diff = sorted(k for k in config if config[k] != builder.sparse_swa_config[k])
            raise ValueError(f"kv_cache_spec/vllm_config of group {group_id!r}: expected the "
                             f"configuration of the groups with window {key[0]} and block size "
                             f"{key[1]}, got a different {', '.join(diff)}")
        else:
            builder.layer_names = list(builder.layer_names) + list(layer_names)
        self._key_of[group_id] = key
        return builder

    def builder(self, group_id: Any) -> SparseSWAMetadataBuilder:
        return self._builders[self._key_of[group_id]]

    @property
    def num_builders(self) -> int:
        return len(self._builders)

    def build(self, common_prefix_len: int, group_metadata: Mapping[Any, Any],
              fast_build: bool = False) -> dict[Any, SparseSWAMetadata]:
        """{group_id: metadata} for the given groups, one build per key."""
        built: dict[tuple, tuple[Any, Any, SparseSWAMetadata]] = {}
        out: dict[Any, SparseSWAMetadata] = {}
        for gid, cm in group_metadata.items():
            key = self._key_of.get(gid)
            if key is None:
                raise ValueError(f"group_metadata: expected groups added with add_group(), got "
                                 f"{gid!r}")
            first = built.get(key)
            if first is None:
                md = self._builders[key].build(common_prefix_len, cm, fast_build)
                built[key] = (gid, cm, md)
            else:
                first_gid, first_cm, md = first
                diff = _batch_difference(first_cm, cm)
                if diff is not None:
                    raise ValueError(
                        f"group_metadata[{gid!r}].{diff}: expected the batch of group "
                        f"{first_gid!r}, which shares its window and block size, got another")
            out[gid] = md
        return out
