# SPDX-License-Identifier: Apache-2.0
"""The attention drop-in: vLLM 0.33's DeepSeek-V4 FlashMLA attention layer
(DeepseekV4FlashMLAAttention) running sparse_swa.sparse_attention (README.md#using-it-from-vllm).

install() puts the methods of SparseSWAFlashMLAAttention on vLLM's class itself, so every layer
vLLM builds afterwards is ours, wherever its model file took the class from:

- get_padded_num_q_heads(n) -> n: q, the attention sink and the output buffer keep the layer's
  own heads (vLLM pads them to 64 or 128 for FlashMLA's kernels);
- forward_mqa(q, kv, positions, output): the decode tokens in one sparse_attention call, the
  prefill tokens in one more, over the SWA cache (segment 1: the builder's decode or prefill rows)
  and the layer's compressed cache (segment 2: C4A's indexer top-k mapped to global slots by
  compressed_topk_to_global, C128A's global decode top-k as vLLM's metadata builder forms it,
  its prefill top-k mapped like C4A's), both fp8_ds_mla pages read in place: no head padding, no
  bf16 gather, no combined index matrix, no FlashMLA plan holder. A prefill (or decode) is split
  into several calls only where its scratch would not fit the workspace vLLM's own layer
  reserves for its prefill (_sparse_swa_budget).

vLLM's contract, kept: the same output buffer and dtype, the tokens vLLM's layer writes (decode
rows when the step has decode requests, prefill rows when it has prefill requests), the warm-up
dummy run (no metadata: the layer's workspace is reserved, the output zeroed), the attention sink
(the layer's attn_sink, first H entries), CUDA-graph capture (no host synchronisation; scratch
comes from vLLM's workspace manager, sized by the dummy run, never grown). vLLM 0.33's
DeepSeek-V4 layer discards the softmax lse; the calls write it to scratch.

Everything runs on torch tensors: CUDA tensors through sparse_swa.sparse_attention on torch's
current stream, CPU tensors through the CPU reference (torch.ops.sparse_swa), for tests.
"""

from __future__ import annotations

import importlib
from typing import Any, ClassVar

import sparse_swa

DTYPE = "fp8_ds_mla"
HEAD_DIM = 512
MAX_HEADS = 128
MAX_QUERY_GROUP = 8  # sparse_swa's query_group_size limit
_ALIGN = 256  # vLLM's workspace manager aligns each tensor it hands out to 256 bytes


def _aligned(nbytes: int) -> int:
    return -(-nbytes // _ALIGN) * _ALIGN


def _nbytes(shape: tuple[int, ...], itemsize: int) -> int:
    n = itemsize
    for d in shape:
        n *= d
    return n


def _stream(t: Any) -> Any:
    """torch's current stream on t's device (where every call of a forward runs), None on CPU."""
    if not t.is_cuda:
        return None
    import torch

    return torch.cuda.current_stream(t.device).cuda_stream


def _pages(cache: Any, block_size: int, name: str) -> Any:
    """vLLM's paged fp8_ds_mla cache [num_blocks, block_size, bytes per token] (its rows in a
    page, the page stride its stride(0)) as the [num_blocks, page bytes] rows sparse_swa reads,
    without a copy."""
    import torch

    if cache is None or cache.dtype != torch.uint8:
        raise ValueError(f"{name}: expected vLLM's fp8_ds_mla cache (torch.uint8), got "
                         f"{None if cache is None else cache.dtype}")
    if cache.dim() == 2:
        return cache
    if cache.dim() != 3 or cache.shape[1] != block_size:
        raise ValueError(f"{name}: expected [num_blocks, {block_size}, bytes per token] (the "
                         f"metadata's block size), got {list(cache.shape)}")
    try:
        return cache.view(cache.shape[0], -1)
    except RuntimeError as e:
        raise ValueError(f"{name}: expected the rows of a page to be contiguous, got strides "
                         f"{list(cache.stride())}") from e


class _Step:
    """One forward's inputs beside q: the metadata and the caches as sparse_swa reads them."""

    def __init__(self, layer: Any, swa_md: Any, comp_md: Any) -> None:
        self.swa_md, self.comp_md = swa_md, comp_md
        self.ratio = int(layer.compress_ratio)
        self.swa_block = int(swa_md.block_size)
        self.swa_pages = _pages(layer.swa_cache_layer.kv_cache, self.swa_block,
                                "swa_cache_layer.kv_cache")
        self.extra_pages = self.extra_block = self.block_table = None
        if self.ratio > 1:
            self.extra_block = int(comp_md.block_size) // self.ratio
            self.extra_pages = _pages(layer.kv_cache, self.extra_block, "kv_cache")
            self.block_table = comp_md.block_table


class SparseSWAFlashMLAAttention:
    """The methods install() puts on vLLM 0.33's DeepseekV4FlashMLAAttention (a mixin: the
    attributes it reads are those vLLM's DeepseekV4Attention sets). _sparse_swa_vllm_module is
    the vLLM module that defines the class: forward_mqa takes get_forward_context and
    current_workspace_manager from it, as vLLM's own forward_mqa does."""

    _sparse_swa_vllm_module: ClassVar[Any] = None

    @classmethod
    def get_padded_num_q_heads(cls, num_heads: int) -> int:
        """The layer's own head count: sparse_attention takes any count from 1 to 128."""
        if not 1 <= int(num_heads) <= MAX_HEADS:
            raise ValueError(f"num_heads: expected 1..{MAX_HEADS} heads per rank "
                             f"(sparse_swa.sparse_attention), got {num_heads}")
        return int(num_heads)

    def forward_mqa(self, q: Any, kv: Any, positions: Any, output: Any) -> None:
        """vLLM's forward_mqa: attention of q [T, H, 512] bf16 into output (q's shape and
        dtype); kv and positions are unused (the KV is in the caches already)."""
        if tuple(output.shape) != tuple(q.shape) or output.dtype != q.dtype:
            raise ValueError(f"output: expected q's shape {list(q.shape)} and dtype {q.dtype}, "
                             f"got {list(output.shape)} {output.dtype}")
        attn_metadata = self._sparse_swa_vllm_module.get_forward_context().attn_metadata
        if attn_metadata is None:  # the warm-up dummy run
            self._sparse_swa_scratch([((self._sparse_swa_budget(q.shape[-1]),), "uint8")])
            output.zero_()
            return
        if not isinstance(attn_metadata, dict):
            raise ValueError(f"attn_metadata: expected a dict of layer prefix -> metadata, got "
                             f"{type(attn_metadata).__name__}")
        swa_md = attn_metadata.get(self.swa_cache_layer.prefix)
        if swa_md is None:
            raise ValueError(f"attn_metadata: expected the SWA metadata under "
                             f"{self.swa_cache_layer.prefix!r}, got none")
        ratio = int(self.compress_ratio)
        comp_md = None
        if ratio > 1:
            if ratio not in (4, 128):
                raise ValueError(f"compress_ratio: expected 1, 4 or 128 (DeepSeek-V4 FlashMLA "
                                 f"layers), got {ratio}")
            comp_md = attn_metadata.get(self.prefix)
            if comp_md is None:
                raise ValueError(f"attn_metadata: expected the compressed cache's metadata "
                                 f"under {self.prefix!r}, got none")
        step = _Step(self, swa_md, comp_md)
        if swa_md.num_prefills > 0:
            self._sparse_swa_prefill(q, output, step)
        if swa_md.num_decodes > 0:
            self._sparse_swa_decode(q, output, step)

    def _sparse_swa_decode(self, q: Any, output: Any, step: _Step) -> None:
        md, td = step.swa_md, int(step.swa_md.num_decode_tokens)
        local = given = None
        if step.ratio == 4:  # the indexer's local top-k of this layer
            local = self.topk_indices_buffer[:td]
        elif step.ratio == 128:  # global slots and lens from vLLM's metadata builder
            given = (step.comp_md.c128a_global_decode_topk_indices,
                     step.comp_md.c128a_decode_topk_lens)
        # Consecutive decode rows of one request share keys (MTP, DSpark): a hint only.
        group = max(1, min(int(getattr(md, "max_decode_query_len", 1) or 1), MAX_QUERY_GROUP))
        self._sparse_swa_run(q[:td], output[:td], md.decode_swa_indices, md.decode_swa_lens,
                             step, 0, local, given, group)

    def _sparse_swa_prefill(self, q: Any, output: Any, step: _Step) -> None:
        md = step.swa_md
        td, tp = int(md.num_decode_tokens), int(md.num_prefill_tokens)
        local = None
        if step.ratio == 4:
            local = self.topk_indices_buffer[td:td + tp]
        elif step.ratio == 128:  # local entries 0..n-1 of vLLM's metadata builder
            local = step.comp_md.c128a_prefill_topk_indices
        if local is not None and local.shape[0] < tp:
            raise ValueError(f"prefill top-k: expected {tp} rows (the prefill tokens), got "
                             f"{local.shape[0]}")
        self._sparse_swa_run(q[td:td + tp], output[td:td + tp], md.prefill_swa_indices,
                             md.prefill_swa_lens, step, td, local, None, 1)

    def _sparse_swa_run(self, q: Any, out: Any, rows: Any, lens: Any, step: _Step, first: int,
                        local: Any, given: Any, group: int) -> None:
        """Tokens first.. of the step (q, out, rows, lens: theirs) in as few calls as the
        workspace allows (chunks of whole query groups)."""
        n, heads = int(q.shape[0]), int(q.shape[1])
        per_token = heads * 4 + (4 * int(local.shape[-1]) + 4 if local is not None else 0)
        budget = self._sparse_swa_budget(q.shape[-1])
        chunk = n
        if n * per_token > budget // 2:  # keep at least half the budget for the workspace
            chunk = max(group, (budget // 2) // per_token // group * group)
        for a in range(0, n, chunk):
            b = min(n, a + chunk)
            self._sparse_swa_call(
                q[a:b], out[a:b], rows[a:b], lens[a:b], step, first + a,
                None if local is None else local[a:b],
                None if given is None else (given[0][a:b], given[1][a:b]), group, budget)

    def _sparse_swa_call(self, q: Any, out: Any, rows: Any, lens: Any, step: _Step, first: int,
                         local: Any, given: Any, group: int, budget: int) -> None:
        """One sparse_attention call; the extra segment is local top-k (mapped to global slots
        here, into scratch) or given (global indices, lens)."""
        n, heads = int(q.shape[0]), int(q.shape[1])
        specs: list[tuple[tuple[int, ...], str]] = [((n, heads), "float32")]
        if local is not None:
            specs += [((n, int(local.shape[-1])), "int32"), ((n,), "int32")]
        extra: dict[str, Any] = {}
        if step.extra_pages is not None:
            indices = local if local is not None else given[0]
            extra = dict(extra_cache=step.extra_pages, extra_block_size=step.extra_block,
                         extra_indices=indices, extra_lens=lens if given is None else given[1])
        need = 0
        if q.is_cuda:  # from shapes only
            need = sparse_swa.sparse_attention_workspace_bytes(
                q, step.swa_pages, step.swa_block, rows, lens, DTYPE, query_group_size=group,
                **extra)
        room = budget - sum(_aligned(_nbytes(s, 4)) for s, _ in specs)
        workspace = max(_ALIGN, min(_aligned(need), room // _ALIGN * _ALIGN))
        scratch = self._sparse_swa_scratch([((workspace,), "uint8")] + specs)
        lse = scratch[1]
        if local is not None:
            extra["extra_indices"], extra["extra_lens"] = self._sparse_swa_to_global(
                step, first, local, scratch[2], scratch[3], _stream(q))
        sinks = self.attn_sink.detach()[:heads]
        if q.is_cuda:
            sparse_swa.sparse_attention(q, step.swa_pages, step.swa_block, rows, lens,
                                        float(self.scale), sinks, DTYPE, out=out, lse=lse,
                                        workspace=scratch[0], query_group_size=group,
                                        stream=_stream(q), **extra)
        else:
            import torch

            # Binds no local name `sparse_swa` (that would shadow the module on the CUDA path).
            importlib.import_module("sparse_swa.torch_ops")  # the CPU path's bf16 handling

            torch.ops.sparse_swa.sparse_attention_out(
                q, step.swa_pages, step.swa_block, rows, lens, out, lse, float(self.scale),
                sinks, DTYPE, extra.get("extra_cache"), extra.get("extra_block_size"),
                extra.get("extra_indices"), extra.get("extra_lens"))

    def _sparse_swa_to_global(self, step: _Step, first: int, local: Any, out: Any,
                              out_lens: Any, stream: Any) -> tuple[Any, Any]:
        """Local compressed top-k of tokens first.. -> (global slots, lens): into out / out_lens
        from the sparse_swa metadata under the drop-in builder's, else from the metadata's token
        map (vLLM's own builder's metadata)."""
        md = step.swa_md
        source = getattr(md, "source", None)
        if isinstance(source, sparse_swa.SwaMetadata) and source.is_current:
            sparse_swa.compressed_topk_to_global(source, first, local, step.block_table,
                                                 step.extra_block, step.ratio, out=out,
                                                 out_lens=out_lens, stream=stream)
            return out, out_lens
        from sparse_swa import _sparse_swa

        return _sparse_swa._compressed_topk_to_global_arrays(
            md.token_to_req_indices, md.is_valid_token, int(md.seq_lens.shape[0]), first, local,
            step.block_table, step.extra_block, step.ratio, stream=stream)

    def _sparse_swa_budget(self, head_dim: int) -> int:
        """The bytes vLLM 0.33's own layer reserves in its dummy run for its prefill (the bf16
        gather of PREFILL_CHUNK_SIZE requests, the combined index rows and their lens, each
        aligned as the workspace manager aligns them): all of the drop-in's scratch fits them,
        so vLLM's memory profile stays its own."""
        cached = self.__dict__.get("_sparse_swa_budget_bytes")
        if cached is not None:
            return cached
        ratio, window = int(self.compress_ratio), int(self.window_size)
        tokens = int(self.max_num_batched_tokens)
        compressed = 0 if ratio <= 1 else -(-int(self.max_model_len) // ratio)
        top_k = 0 if ratio <= 1 else int(self.topk_indices_buffer.shape[-1])
        combined = -(-(top_k + window + int(self.max_image_tokens)) // 128) * 128
        gather = int(self.PREFILL_CHUNK_SIZE) * (compressed + window + tokens) * int(head_dim)
        budget = (_aligned(2 * gather) + _aligned(4 * tokens * combined)
                  + _aligned(4 * tokens))
        self.__dict__["_sparse_swa_budget_bytes"] = budget
        return budget

    def _sparse_swa_scratch(self, specs: list[tuple[tuple[int, ...], str]]) -> list[Any]:
        """Tensors of (shape, dtype name) from vLLM's workspace manager, all at once."""
        import torch

        manager = self._sparse_swa_vllm_module.current_workspace_manager()
        return manager.get_simultaneous(*((s, getattr(torch, d)) for s, d in specs))
