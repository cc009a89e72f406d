# SPDX-License-Identifier: Apache-2.0
"""What the attention drop-in's tests and benchmark stand in for, in torch alone (no vLLM, no
Triton): vLLM's WorkspaceManager, vLLM's two FlashMLA entry points over a flash_mla module, an
fp32 emulation of that module (TorchFlashMLA), the fp32 reference attention over decoded keys,
and the differential's tolerance (compare)."""

from __future__ import annotations

import math
import types

import numpy as np
import torch

import sparse_swa

HEAD = 512


class WorkspaceManager:
    """vLLM's WorkspaceManager rules: one uint8 buffer, each tensor a view at a 256-byte
    aligned offset, the buffer grown to the largest request, growth refused once locked.
    fresh=True instead allocates every request anew (for measuring a step's own peak)."""

    def __init__(self, device, fresh=False):
        self.device, self.fresh = torch.device(device), fresh
        self.buffer, self.locked, self.largest = None, False, 0

    def get_simultaneous(self, *shapes_and_dtypes):
        sizes = [math.prod(s) * torch.empty((), dtype=d).element_size()
                 for s, d in shapes_and_dtypes]
        aligned = [-(-n // 256) * 256 for n in sizes]
        total = sum(aligned)
        self.largest = max(self.largest, total)
        if self.fresh:
            return [torch.empty(s, dtype=d, device=self.device) for s, d in shapes_and_dtypes]
        if self.buffer is None or self.buffer.numel() < total:
            assert not self.locked, (f"workspace growth to {total} bytes after locking at "
                                     f"{0 if self.buffer is None else self.buffer.numel()}")
            self.buffer = torch.empty(total, dtype=torch.uint8, device=self.device)
        out, offset = [], 0
        for (shape, dtype), n, a in zip(shapes_and_dtypes, sizes, aligned):
            out.append(self.buffer[offset:offset + n].view(dtype).reshape(shape))
            offset += a
        return out


class FlashMLAEntryPoints:
    """vllm.v1.attention.ops.flashmla's flash_mla_with_kvcache and flash_mla_sparse_fwd (the
    keyword arguments vLLM's layer passes) over a flash_mla module. The wheel has no out=: its
    result is copied into vLLM's out (copy=False leaves out alone, for timing). vLLM's SWA
    builder hands out its own plan holders; each gets one of the module's, made at its first
    use, as vLLM's FlashMLA makes one per holder."""

    def __init__(self, flash_mla, copy=True, legacy=True):
        self.flash_mla, self.copy, self.legacy = flash_mla, copy, legacy

    def sched(self, holder):
        meta = getattr(holder, "_flash_mla_meta", None)
        if meta is None:
            meta = self.flash_mla.get_mla_metadata()[0]
            holder._flash_mla_meta = meta
        return meta

    def flash_mla_with_kvcache(self, q, k_cache, block_table, head_dim_v, tile_scheduler_metadata,
                               cache_seqlens, is_fp8_kvcache, indices, topk_length,
                               softmax_scale, attn_sink, extra_k_cache=None,
                               extra_indices_in_kvcache=None, extra_topk_length=None, out=None):
        o, lse = self.flash_mla.flash_mla_with_kvcache(
            q, k_cache, block_table, cache_seqlens, head_dim_v,
            self.sched(tile_scheduler_metadata), softmax_scale=softmax_scale,
            is_fp8_kvcache=is_fp8_kvcache, indices=indices, attn_sink=attn_sink,
            extra_k_cache=extra_k_cache, extra_indices_in_kvcache=extra_indices_in_kvcache,
            topk_length=topk_length, extra_topk_length=extra_topk_length,
            use_legacy=self.legacy)
        if out is not None and self.copy:
            out.copy_(o)
        return o, lse

    def flash_mla_sparse_fwd(self, q, kv, indices, sm_scale, attn_sink=None, topk_length=None,
                             out=None):
        o, max_logits, lse = self.flash_mla.flash_mla_sparse_fwd(
            q, kv, indices, sm_scale, attn_sink=attn_sink, topk_length=topk_length,
            use_legacy=self.legacy)
        if out is not None and self.copy:
            out.copy_(o)
        return o, max_logits, lse


def reference_attention(q, keys, valid, scale, sink):
    """fp32 attention of q [n, H, 512] over keys [n, L, 512] (valid [n, L] bool) with sinks
    [H] -> (out [n, H, 512], the weighted mean of |v| [n, H, 512], lse [n, H]); a row without
    keys gets zeros and lse +inf. Weights include the sink's share (docs/semantics.md#sparse-
    attention)."""
    s = torch.einsum("nhd,nld->nhl", q.float(), keys) * scale
    s = s.masked_fill(~valid[:, None, :], float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    empty = ~valid.any(dim=1)
    lse = lse.masked_fill(empty[:, None], float("inf"))
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    p = p / (1.0 + torch.exp(sink.float()[None, :, None] - lse[..., None]))
    return (torch.einsum("nhl,nld->nhd", p, keys), torch.einsum("nhl,nld->nhd", p, keys.abs()),
            lse)


def decoded_table(pages, block_size):
    """Every slot of an fp8_ds_mla cache [num_blocks, page bytes] decoded to fp32 [slots, 512]
    (sparse_swa.decode_kv), where the cache lives."""
    slots = pages.shape[0] * block_size
    if pages.is_cuda:
        ids = torch.arange(slots, dtype=torch.int64, device=pages.device)
        return sparse_swa.decode_kv(pages, block_size, ids)
    return torch.from_numpy(np.asarray(sparse_swa.decode_kv(
        pages.numpy(), block_size, np.arange(slots, dtype=np.int64))))


def gather_rows(table, idx, lens):
    """Rows of table named by idx [n, w] inside lens (and >= 0): (keys [n, w, 512], valid)."""
    w = idx.shape[1]
    valid = (torch.arange(w, device=idx.device)[None, :] < lens[:, None].long()) & (idx >= 0)
    keys = table[idx.clamp(min=0).long()] * valid[..., None]
    return keys, valid


class TorchFlashMLA:
    """The two FlashMLA entry points vLLM's layer calls, in fp32 torch (for machines without
    the wheel): sparse decode over fp8_ds_mla pages [blocks, B, 1, bytes per token] and sparse
    prefill over bf16 rows [s_kv, 1, 512], -1 entries skipped, topk_length honoured."""

    @staticmethod
    def get_mla_metadata(*args, **kwargs):
        return types.SimpleNamespace(have_initialized=False), None

    @staticmethod
    def _pages(k_cache):
        c = k_cache[:, :, 0]
        return c.as_strided((c.shape[0], c.shape[1] * c.shape[2]), (c.stride(0), 1))

    def flash_mla_with_kvcache(self, q, k_cache, block_table, cache_seqlens, head_dim_v, meta,
                               softmax_scale=None, is_fp8_kvcache=True, indices=None,
                               attn_sink=None, extra_k_cache=None, extra_indices_in_kvcache=None,
                               topk_length=None, extra_topk_length=None, use_legacy=False):
        b, s_q, h = q.shape[:3]
        qq = q.reshape(b * s_q, h, HEAD)
        idx = indices.reshape(b * s_q, -1)
        lens = (topk_length if topk_length is not None
                else torch.full((b,), idx.shape[1], dtype=torch.int32, device=q.device))
        lens = lens.repeat_interleave(s_q)
        keys, valid = gather_rows(decoded_table(self._pages(k_cache), k_cache.shape[1]), idx,
                                   lens)
        if extra_k_cache is not None:
            eidx = extra_indices_in_kvcache.reshape(b * s_q, -1)
            elens = extra_topk_length.repeat_interleave(s_q)
            ek, ev = gather_rows(decoded_table(self._pages(extra_k_cache),
                                                extra_k_cache.shape[1]), eidx, elens)
            keys, valid = torch.cat([keys, ek], 1), torch.cat([valid, ev], 1)
        sink = attn_sink if attn_sink is not None else torch.full((h,), float("-inf"))
        out, _, lse = reference_attention(qq, keys, valid, softmax_scale, sink.to(q.device))
        return out.to(torch.bfloat16).reshape(b, s_q, h, HEAD), lse.reshape(b, s_q, h)

    def flash_mla_sparse_fwd(self, q, kv, indices, sm_scale, d_v=512, attn_sink=None,
                             topk_length=None, use_legacy=False):
        idx = indices[:, 0]
        lens = (topk_length if topk_length is not None
                else torch.full((idx.shape[0],), idx.shape[1], dtype=torch.int32))
        idx = torch.where(idx < kv.shape[0], idx, -1)
        keys, valid = gather_rows(kv[:, 0].float(), idx, lens)
        sink = attn_sink if attn_sink is not None else torch.full((q.shape[1],), float("-inf"))
        out, _, lse = reference_attention(q, keys, valid, sm_scale, sink.to(q.device))
        return out.to(torch.bfloat16), None, lse


def compare(ours, vllm, ref, mean, heads):
    """Rows (token, head) where |ours - vLLM| exceeds 2^-7 (mean |v| + |ref|) + 2e-3 anywhere:
    each side within the prefill kernels' bound 2^-8 (mean |v| + |ref|) of the exact value
    (docs/design.md#attention-precision) plus the fp32 one, their difference within twice
    that. Returns (rows outside, largest |ours - vLLM| / allowed, largest |ours - ref| / the
    one-sided bound, the same for vLLM)."""
    o, v = ours[:, :heads].float(), vllm[:, :heads].float()
    allowed = 2.0 ** -7 * (mean + ref.abs()) + 2e-3
    one_side = 2.0 ** -8 * (mean + ref.abs()) + 1e-3
    diff = (o - v).abs()
    bad = (diff > allowed).any(dim=-1)
    return (int(bad.sum()), float((diff / allowed).max()) if diff.numel() else 0.0,
            float(((o - ref).abs() / one_side).max()) if diff.numel() else 0.0,
            float(((v - ref).abs() / one_side).max()) if diff.numel() else 0.0)


def random_q(tokens, heads, padded, device, g, scale=1.0):
    """q [tokens, padded, 512] bf16, zeros past `heads` (as vLLM's fused kernel pads it)."""
    q = torch.zeros((tokens, padded, HEAD), dtype=torch.bfloat16)
    q[:, :heads] = (torch.randn((tokens, heads, HEAD), generator=g) * scale).to(torch.bfloat16)
    return q.to(device)


