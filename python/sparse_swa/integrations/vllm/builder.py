# SPDX-License-Identifier: Apache-2.0
"""The drop-in builders: vLLM's DeepseekSparseSWAMetadataBuilder interface (vLLM 0.33) over
sparse_swa.MetadataBuilder, the CUDA backend for CUDA tensors, the CPU one for host tensors.
One class per SWA builder vLLM's DeepSeek-V4 and V4.1 attention layers use; install() hands
them to vLLM (README.md#using-it-from-vllm)."""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple

import numpy as np

import sparse_swa

from . import _vllm
from . import config as cfg
from .metadata import SparseSWAMetadata

_BASE = _vllm.builder_base()
_BASE_INIT = _vllm.attention_builder_init()
# What this build of sparse_swa provides (the bounded-replay build and draft update of vLLM
# 0.33, the FlashInfer per-token lens); without them the drop-in does what it can and refuses
# what it cannot (a non-zero replay_start).
_HAS_REPLAY = hasattr(sparse_swa.SwaMetadata, "replay_start")
_HAS_FLASHINFER_LENS = hasattr(sparse_swa.SwaMetadata, "flashinfer_decode_topk_lens")


def _zeros(like: Any, n: int) -> Any:
    """n int32 zeros in like's framework and device (torch or numpy)."""
    if hasattr(like, "new_zeros"):
        import torch

        return like.new_zeros(n, dtype=torch.int32)
    return np.zeros(n, dtype=np.int32)


def _is_torch(a: Any) -> bool:
    return type(a).__module__.split(".")[0] == "torch"


def _require_no_replay(replay_start: Any) -> None:
    host = replay_start.cpu().numpy() if _is_torch(replay_start) else np.asarray(replay_start)
    if host.any():
        raise ValueError("replay_start: expected zeros (this sparse_swa build has no bounded "
                         "replay: MetadataBuilder.build takes no replay_start), got "
                         f"{host.tolist()}")


class BuildInputs(NamedTuple):
    """One group's build arguments taken from its CommonAttentionMetadata."""

    slots: Any  # [T] int64, this rank's share under PCP
    cache_slots: Any  # PCP: the gathered slot_mapping, else None
    cache_positions: Any  # PCP: the gathered positions, else None
    spans: Any  # mm_req_doc_ranges where the builder widens image rows, else None
    seq_lens_cpu: Any  # host seq_lens (vLLM's upper bound where it has one)
    causal: bool
    replay: Any  # replay_start for sparse_swa (None: none, or this build has no replay)


class SparseSWAMetadataBuilder(_BASE):
    """vLLM's DeepseekSparseSWAMetadataBuilder (DeepSeek-V4 rules)."""

    reorder_batch_threshold: int | None = None
    _cudagraph_support: ClassVar[Any] = _vllm.cg_support("UNIFORM_BATCH")
    supports_draft_decode_metadata_update = True
    deepseek_v41: ClassVar[bool] = False  # DeepSeek-V4.1 layer types and PCP pass-through
    flashinfer_decode_lens: ClassVar[bool] = False  # fills flashinfer_decode_* (V4.1 FlashInfer)

    def __init__(self, kv_cache_spec: Any, layer_names: list[str], vllm_config: Any,
                 device: Any) -> None:
        if _BASE_INIT is not None and _BASE is not object:
            _BASE_INIT(self, kv_cache_spec, layer_names, vllm_config, device)
        else:
            self.kv_cache_spec, self.layer_names = kv_cache_spec, layer_names
            self.vllm_config, self.device = vllm_config, device
        hf = vllm_config.model_config.hf_config
        self._layer_types = (cfg.v41_layer_types(hf) if self.deepseek_v41
                             else cfg.v4_layer_types(hf))
        self.sparse_swa_config = cfg.builder_config(
            kv_cache_spec, vllm_config, flashinfer_decode_lens=self.flashinfer_decode_lens)
        c = self.sparse_swa_config
        self.head_size = getattr(kv_cache_spec, "head_size", 512)
        self.compress_ratio = getattr(kv_cache_spec, "tokens_per_state", 1)
        self.block_size = c["block_size"]
        self.window_size = c["window_size"]
        self.max_model_len = c["max_model_len"]
        self.max_num_batched_tokens = self._max_tokens = c["max_num_batched_tokens"]
        self.num_speculative_tokens = c["num_speculative_tokens"]
        self.max_image_tokens = c["max_image_tokens"]
        self.is_dspark = c["speculative_method"] == "dspark"
        self.reorder_batch_threshold = None
        parallel = getattr(vllm_config, "parallel_config", None)
        self.pcp_size = 1
        if self.deepseek_v41:
            self.pcp_size = int(getattr(parallel, "prefill_context_parallel_size", 1) or 1)
        self.pcp_rank = _vllm.pcp_group().rank_in_group if self.pcp_size > 1 else 0
        self._no_replay_len = (2 if self.pcp_size > 1 else 1) * c["max_num_seqs"] + 1
        self.no_replay_start: Any = None  # made in the batch's framework at the first build
        self._flashinfer_lens: Any = None  # (topk lens, seq lens) [max tokens] without binding
        self._tile_sched_enabled, self._tile_sched_factory = _vllm.tile_sched_factory()

        device_type = getattr(device, "type", str(device).split(":")[0])
        if device_type == "cuda":
            import torch  # the engine's own; only CUDA builders need it here

            with torch.cuda.device(device):  # the CUDA backend takes the current device
                self._builder = sparse_swa.MetadataBuilder(c, device="cuda")
                self.no_replay_start = torch.zeros(self._no_replay_len, dtype=torch.int32,
                                                   device=device)
        else:
            self._builder = sparse_swa.MetadataBuilder(c, device="cpu")
        self.decode_threshold = self._builder.decode_threshold
        self._check_decode_threshold(vllm_config)
        self.prefill_index_width = self._builder.prefill_index_width
        self.noncausal_index_width = self._builder.noncausal_index_width if self.is_dspark else 0

    def _check_decode_threshold(self, vllm_config: Any) -> None:
        want = cfg.decode_threshold(vllm_config)
        vllm_rule = _vllm.max_decode_query_len()
        if vllm_rule is not None and vllm_rule(vllm_config) != want:
            raise ValueError(f"vllm_config: expected vLLM's max_decode_query_len to give the "
                             f"drop-in's decode threshold {want}, got {vllm_rule(vllm_config)}")
        if self.decode_threshold != want:
            raise ValueError(f"vllm_config: expected sparse_swa's decode threshold {want}, got "
                             f"{self.decode_threshold}")

    @property
    def sparse_swa_builder(self) -> sparse_swa.MetadataBuilder:
        """The sparse_swa.MetadataBuilder underneath (its buffers back every metadata)."""
        return self._builder

    def build(self, common_prefix_len: int, common_attn_metadata: Any, fast_build: bool = False,
              replay_start: Any = None) -> SparseSWAMetadata:
        """The step's metadata. replay_start: [R] int32, each request's first position with
        window KV (bounded replay), or None for none; common_prefix_len and fast_build are
        accepted and unused, as in vLLM's builder."""
        cm = common_attn_metadata
        return self._build_with(cm, self._build_inputs(cm, replay_start), replay_start)

    def _build_with(self, cm: Any, inputs: BuildInputs, replay_start: Any) -> SparseSWAMetadata:
        kw = {} if inputs.replay is None else {"replay_start": inputs.replay}
        md = self._builder.build(cm.query_start_loc, cm.seq_lens, cm.block_table_tensor,
                                 inputs.slots, causal=inputs.causal, image_spans=inputs.spans,
                                 query_start_loc_cpu=cm.query_start_loc_cpu,
                                 seq_lens_cpu=inputs.seq_lens_cpu, **kw)
        return self._wrap(md, cm, inputs, replay_start)

    def _build_inputs(self, cm: Any, replay_start: Any) -> BuildInputs:
        """What build() hands sparse_swa besides cm's query_start_loc(_cpu), seq_lens and
        block_table_tensor (SharedSWAMetadataBuilds hands the same to build_groups)."""
        slots, cache_slots, cache_positions = cm.slot_mapping, None, None
        if self.pcp_size > 1:  # queries use this rank's slots, cache writes the gathered ones
            size = -(-int(cm.slot_mapping.shape[0]) // self.pcp_size)
            slots = cm.slot_mapping[self.pcp_rank * size:(self.pcp_rank + 1) * size]
            cache_slots = cm.slot_mapping
            if getattr(cm, "positions", None) is None:
                raise ValueError("common_attn_metadata.positions: expected the step's positions "
                                 "under prefill context parallelism, got None")
            cache_positions = _vllm.pcp_group().all_gather(cm.positions, dim=0)
        spans = None
        if self.max_image_tokens > 0:
            ranges = getattr(cm, "mm_req_doc_ranges", None)
            if ranges and any(ranges.values()):
                spans = ranges
        seq_cpu = getattr(cm, "seq_lens_cpu_upper_bound", None)
        if seq_cpu is None:
            seq_cpu = getattr(cm, "seq_lens_cpu", None)
        replay = None
        if replay_start is not None:
            if _HAS_REPLAY:
                replay = replay_start
            else:
                _require_no_replay(replay_start)
        return BuildInputs(slots, cache_slots, cache_positions, spans, seq_cpu,
                           bool(getattr(cm, "causal", True)), replay)

    def _wrap(self, md: Any, cm: Any, inputs: BuildInputs, replay_start: Any
              ) -> SparseSWAMetadata:
        """The drop-in's metadata around sparse_swa's md, built from cm and inputs."""
        if replay_start is None:
            if self.no_replay_start is None:
                self.no_replay_start = _zeros(cm.seq_lens, self._no_replay_len)
            replay_start = self.no_replay_start
        out = self._metadata(md, cm, inputs.slots, replay_start)
        out.cache_slot_mapping, out.cache_positions = inputs.cache_slots, inputs.cache_positions
        if self.flashinfer_decode_lens and not inputs.causal and md.num_decode_tokens > 0:
            self._flashinfer_decode_lens(md, out)
        return out

    def build_for_cudagraph_capture(self, common_attn_metadata: Any) -> SparseSWAMetadata:
        return self.build(0, common_attn_metadata)

    def update_draft_decode_metadata(self, metadata: SparseSWAMetadata) -> None:
        """vLLM 0.33's refresh between draft steps, in place and capture safe: validity from the
        metadata's current slot_mapping, the token map of its decode tokens from its current
        query_start_loc (padding tokens: the last request), decode rows in the build's mode
        (non-causal stays non-causal) with the build's replay_start; new plan holders, cleared
        FlashInfer cache."""
        if metadata.num_decode_tokens == 0:
            return
        src = metadata.source
        if src is None:
            raise ValueError("metadata: expected metadata returned by this builder's build()")
        if _HAS_REPLAY:
            self._builder.update_draft_decode_metadata(
                src, seq_lens=metadata.seq_lens, block_table=metadata.block_table,
                slot_mapping=metadata.slot_mapping, query_start_loc=metadata.query_start_loc,
                query_start_loc_cpu=metadata.query_start_loc_cpu)
        else:  # this sparse_swa build's update: causal rows of W, the build's mapping
            self._builder.update_draft_decode_metadata(src, seq_lens=metadata.seq_lens,
                                                       block_table=metadata.block_table)
        for name in ("is_valid_token", "token_to_req_indices", "decode_swa_indices",
                     "decode_swa_lens"):
            setattr(metadata, name, getattr(src, name))
        self._set_tile_sched(metadata, self.build_tile_scheduler(metadata.num_decode_tokens))
        metadata.flashinfer_sparse_index_cache.clear()
        if metadata.flashinfer_decode_topk_lens is not None:
            self._flashinfer_decode_lens(src, metadata)

    def build_tile_scheduler(self, num_decode_tokens: int) -> dict[str, Any]:
        """One fresh plan holder per present layer type (None for the others, and for all when
        there are no decode tokens or this platform uses none)."""
        if num_decode_tokens == 0 or not self._tile_sched_enabled:
            return {t: None for t in cfg.LAYER_TYPES}
        make = self._tile_sched_factory
        return {t: (make() if make else t) if t in self._layer_types else None
                for t in cfg.LAYER_TYPES}

    @staticmethod
    def _set_tile_sched(out: SparseSWAMetadata, holders: dict[str, Any]) -> None:
        for t, holder in holders.items():
            setattr(out, f"tile_sched_{t}", holder)

    def _flashinfer_decode_lens(self, md: Any, out: SparseSWAMetadata) -> None:
        """DeepSeek-V4.1 FlashInfer's per-token decode lens max(lens, W) and seq_lens[token's
        request], from the binding or, where it has none, computed here into fixed buffers."""
        if _HAS_FLASHINFER_LENS and md.flashinfer_decode_topk_lens is not None:
            out.flashinfer_decode_topk_lens = md.flashinfer_decode_topk_lens
            out.flashinfer_decode_seq_lens = md.flashinfer_decode_seq_lens
            return
        n, lens = out.num_decode_tokens, out.decode_swa_lens
        owners = out.token_to_req_indices[:n]
        if self._flashinfer_lens is None:
            self._flashinfer_lens = tuple(_zeros(lens, self._max_tokens) for _ in range(2))
        topk, seq = (b[:n] for b in self._flashinfer_lens)
        if _is_torch(lens):
            import torch

            torch.clamp(lens, min=self.window_size, out=topk)
            torch.index_select(out.seq_lens, 0, owners, out=seq)
        else:
            np.maximum(lens, self.window_size, out=topk)
            np.take(out.seq_lens, owners, out=seq)
        out.flashinfer_decode_topk_lens, out.flashinfer_decode_seq_lens = topk, seq

    def _metadata(self, md: Any, cm: Any, slots: Any, replay_start: Any) -> SparseSWAMetadata:
        out = SparseSWAMetadata(
            block_table=cm.block_table_tensor,
            slot_mapping=slots,
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
            replay_start=replay_start,
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
        self._set_tile_sched(out, self.build_tile_scheduler(md.num_decode_tokens))
        out.source = md
        return out


class SparseSWAFlashMLAMetadataBuilder(SparseSWAMetadataBuilder):
    """DeepSeek-V4's FlashMLA SWA builder (varlen decode: every CUDA-graph batch)."""

    _cudagraph_support: ClassVar[Any] = _vllm.cg_support("ALWAYS")


class SparseSWAFlashInferMetadataBuilder(SparseSWAMetadataBuilder):
    """DeepSeek-V4's FlashInfer SWA builder (varlen decode)."""

    _cudagraph_support: ClassVar[Any] = _vllm.cg_support("ALWAYS")


class SparseSWAV41MetadataBuilder(SparseSWAMetadataBuilder):
    """DeepSeek-V4.1's SWA builder: its layer types (ratio 0 SWA-only, 1 c1a, 2 c2a) and, under
    prefill context parallelism, this rank's slots with the gathered cache_slot_mapping and
    cache_positions."""

    deepseek_v41: ClassVar[bool] = True


class SparseSWAV41FlashMLAMetadataBuilder(SparseSWAV41MetadataBuilder):
    """DeepSeek-V4.1's FlashMLA SWA builder."""

    _cudagraph_support: ClassVar[Any] = _vllm.cg_support("ALWAYS")


class SparseSWAV41FlashInferMetadataBuilder(SparseSWAV41MetadataBuilder):
    """DeepSeek-V4.1's FlashInfer SWA builder: non-causal steps also carry the per-token
    flashinfer_decode_topk_lens / flashinfer_decode_seq_lens."""

    _cudagraph_support: ClassVar[Any] = _vllm.cg_support("ALWAYS")
    flashinfer_decode_lens: ClassVar[bool] = True
