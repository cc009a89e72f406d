# SPDX-License-Identifier: Apache-2.0
"""The dispatch-width policy: which index widths a consumer kernel accepts (host only, no GPU).

A consumer kernel library instantiates only some widths; a width it never instantiated aborts
inside it. These functions let an engine ask, at start-up, for exactly the widths a consumer
runs and fail early, naming the shape, when no kernel can serve a configuration
(docs/semantics.md#dispatch-policy)::

    from sparse_swa import BuilderConfig, dispatch
    cfg = BuilderConfig(window_size=128, block_size=64, max_num_batched_tokens=256,
                        max_num_seqs=16, max_model_len=4096, num_speculative_tokens=2,
                        speculative_method="dspark")
    cfg.noncausal_index_width = dispatch.choose_noncausal_width(cfg, "flashmla_sparse_decode")
    dispatch.validate_config(cfg, "flashmla_sparse_decode", heads=64)  # or ValueError

Policies are named by their built-in names (POLICIES). A config is a BuilderConfig or a dict
with the JSON config's field names. heads, attn_block_size and indexer_topk describe the
deployment (query heads per rank as the kernel runs them, the main-model KV block, the indexer
top-k); bad values raise ValueError naming the argument.
"""

from __future__ import annotations

from typing import Any

from . import _sparse_swa

POLICIES: tuple[str, ...] = tuple(_sparse_swa._dispatch_policy_names())
"""The built-in consumer policies:

flashmla_sparse_decode   heads 64: topk and extra_topk multiples of 64; heads 128: of 128
flashinfer_sm120_decode  topk in {128, 192, 256, 512, 1024} x heads {8, 16, 32, 64, 128},
                         extra_topk multiples of 64
flashinfer_sm100         mixed layout, heads {8, 16, 32, 64, 128}, any row multiple of 4
rocm_ragged              ragged layout, anything
sparse_swa               this library's own kernels, anything
"""

__all__ = [
    "POLICIES",
    "accepts",
    "choose_noncausal_width",
    "choose_width",
    "dispatch_tuples",
    "policy_info",
    "validate_config",
]


def policy_info(policy: str) -> dict[str, Any]:
    """{"name", "layout" ("separate" | "mixed" | "ragged"), "reads_prefill_rows", "max_topk",
    "description"} of a built-in policy."""
    return _sparse_swa._dispatch_policy_info(policy)


def accepts(policy: str, *, heads: int, topk: int, page_block_size: int, extra_topk: int = 0,
            extra_page_block_size: int = 0) -> bool:
    """Whether the policy's kernels accept this launch shape (extra_topk 0: no compressed
    cache, which every kernel accepts)."""
    return _sparse_swa._dispatch_accepts(policy, heads, topk, page_block_size, extra_topk,
                                         extra_page_block_size)


def choose_width(needed: int, policy: str, *, heads: int = 0, page_block_size: int = 0,
                 extra_topk: int = 0, extra_page_block_size: int = 0) -> int:
    """The smallest row width >= needed that the policy accepts with the given other fields
    (heads or page_block_size 0 match any rule). The columns past `needed` are -1, masked by
    lens. ValueError listing the accepted widths when there is none."""
    return _sparse_swa._dispatch_choose_width(needed, policy, heads, page_block_size, extra_topk,
                                              extra_page_block_size)


def choose_noncausal_width(config: Any, policy: str, *, heads: int = 64,
                           attn_block_size: int = 256, indexer_topk: int = 512) -> int:
    """For BuilderConfig.noncausal_index_width: the DSpark non-causal row width the policy
    accepts, >= W + the decode threshold (docs/semantics.md#dspark-width)."""
    return _sparse_swa._dispatch_choose_noncausal_width(config, policy, heads, attn_block_size,
                                                        indexer_topk)


def validate_config(config: Any, policy: str, *, heads: int = 64, attn_block_size: int = 256,
                    indexer_topk: int = 512) -> None:
    """None when the policy accepts every launch shape the config can produce (causal decode,
    DSpark non-causal and, for policies that read them, prefill rows, per layer type); else
    ValueError naming the first rejected shape and what the policy accepts."""
    _sparse_swa._dispatch_validate_config(config, policy, heads, attn_block_size, indexer_topk)


def dispatch_tuples(config: Any, policy: str, *, heads: int = 64, attn_block_size: int = 256,
                    indexer_topk: int = 512) -> list[dict[str, Any]]:
    """Every launch shape the config can make the policy's kernels see: dicts of heads, topk,
    page_block_size, extra_topk, extra_page_block_size, "source" (e.g. "decode causal
    swaonly") and "accepted"."""
    return _sparse_swa._dispatch_tuples(config, policy, heads, attn_block_size, indexer_topk)
