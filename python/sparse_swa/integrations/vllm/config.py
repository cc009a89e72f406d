# SPDX-License-Identifier: Apache-2.0
"""The sparse_swa builder config for vLLM's kv_cache_spec and vllm_config, read by vLLM 0.33's
rules (README.md#using-it-from-vllm): layer types from the compress ratios, the DeepSeek-V4-only
image widening, the decode threshold of the model-runner generation."""

from __future__ import annotations

from typing import Any

import sparse_swa

from . import _vllm

LAYER_TYPES = ("swaonly", "c4a", "c128a", "c1a", "c2a")
# DeepSeek-V4.1 ratios: 0 = sliding window only, 1 and 2 = compressed caches of their own page.
V41_LAYER_TYPES = {0: "swaonly", 1: "c1a", 2: "c2a"}
_V4_LAYER_TYPES = {2: "c2a", 4: "c4a", 128: "c128a"}


def compress_ratios(hf_config: Any) -> list[int]:
    """Per-layer compress ratios, MTP layers included (0 = sliding window): compress_ratios when
    the config has it, else compress_rates by layer_types followed by one 0 per MTP layer, else
    []. The rule of vLLM 0.33's get_compress_ratios."""
    ratios = getattr(hf_config, "compress_ratios", None)
    if ratios is not None:
        return list(ratios)
    rates = getattr(hf_config, "compress_rates", None)
    if rates is None:
        return []
    out = [rates.get(t, 0) for t in hf_config.layer_types]
    return out + [0] * int(getattr(hf_config, "num_nextn_predict_layers", 0) or 0)


def v4_layer_types(hf_config: Any) -> set[str]:
    """DeepSeek-V4's layer types: a ratio <= 1 is SWA-only; ValueError outside {<=1, 2, 4, 128}."""
    out = set()
    for i, ratio in enumerate(compress_ratios(hf_config) or [1]):
        r = int(ratio)
        if r > 1 and r not in _V4_LAYER_TYPES:
            raise ValueError(f"hf_config compress_ratios[{i}]: expected <= 1, 2, 4 or 128 "
                             f"(DeepSeek-V4), got {r}")
        out.add(_V4_LAYER_TYPES.get(r, "swaonly"))
    return out


def v41_layer_types(hf_config: Any) -> set[str]:
    """DeepSeek-V4.1's layer types, from compress_ratios alone (absent: [0])."""
    out = set()
    for i, ratio in enumerate(getattr(hf_config, "compress_ratios", None) or [0]):
        if int(ratio) not in V41_LAYER_TYPES:
            raise ValueError(f"hf_config.compress_ratios[{i}]: expected 0, 1 or 2 "
                             f"(DeepSeek-V4.1), got {int(ratio)}")
        out.add(V41_LAYER_TYPES[int(ratio)])
    return out


def max_image_tokens(hf_config: Any) -> int:
    """Mi, the widening of prefill rows for image spans: vision_max_n_token when the config has
    vision layers and is a DeepSeek-V4 config (vLLM 0.33: transformers' DeepseekV4Config;
    DeepSeek-V4.1 image tokens take plain causal windows), else 0. Where vLLM's builder has no
    such gate (the seed's), any config with vision layers widens."""
    if (getattr(hf_config, "vision_n_layers", 0) or 0) <= 0:
        return 0
    gate = _vllm.vision_config_class()
    if gate is not None and not isinstance(hf_config, gate):
        return 0
    return int(getattr(hf_config, "vision_max_n_token", 0) or 0)


def decode_threshold(vllm_config: Any) -> int:
    """θ, the widest decode query: 1 + k, and k more for parallel drafting on the V1 model
    runner only (vLLM 0.33's max_decode_query_len)."""
    spec = vllm_config.speculative_config
    if spec is None or spec.num_speculative_tokens is None:
        return 1
    k = int(spec.num_speculative_tokens)
    extra = k if getattr(spec, "parallel_drafting", False) and not model_runner_v2(
        vllm_config) else 0
    return 1 + k + extra


def model_runner_v2(vllm_config: Any) -> bool:
    return bool(getattr(vllm_config, "use_v2_model_runner", False))


# Whether this sparse_swa build takes the model-runner generation as a config field.
_HAS_MODEL_RUNNER_V2 = hasattr(sparse_swa.BuilderConfig, "model_runner_v2")


def builder_config(kv_cache_spec: Any, vllm_config: Any, *,
                   flashinfer_decode_lens: bool = False) -> dict[str, Any]:
    """The sparse_swa builder config (JSON field names) for vLLM's kv_cache_spec and
    vllm_config. DeepSeek-V4.1's layer types are the builder's own business (the config holds
    the V4 reading of the ratios, which decides nothing V4.1 reads)."""
    hf = vllm_config.model_config.hf_config
    spec = vllm_config.speculative_config
    k = int(spec.num_speculative_tokens or 0) if spec is not None else 0
    if spec is None:
        method = "none"
    else:
        use_dspark = getattr(spec, "use_dspark", None)
        method = "dspark" if callable(use_dspark) and use_dspark() else "mtp"
    parallel = bool(spec is not None and getattr(spec, "parallel_drafting", False))
    ratios = sorted({max(int(r), 1) for r in compress_ratios(hf) or [1]})
    scheduler = vllm_config.scheduler_config
    config = {
        "window_size": int(hf.sliding_window),
        "block_size": int(kv_cache_spec.block_size),
        "max_num_batched_tokens": int(scheduler.max_num_batched_tokens),
        "max_num_seqs": int(scheduler.max_num_seqs),
        "max_model_len": int(vllm_config.model_config.max_model_len),
        "num_speculative_tokens": k,
        "speculative_method": method,
        "parallel_drafting": parallel,
        "max_image_tokens": max_image_tokens(hf),
        "compress_ratios": ratios,
    }
    if _HAS_MODEL_RUNNER_V2:
        config["model_runner_v2"] = model_runner_v2(vllm_config)
    elif parallel and model_runner_v2(vllm_config):
        # θ = 1 + k either way; this build of sparse_swa knows only the V1 runner's rule.
        config["parallel_drafting"] = False
    if flashinfer_decode_lens and hasattr(sparse_swa.BuilderConfig, "flashinfer_decode_lens"):
        config["flashinfer_decode_lens"] = True
    return config
