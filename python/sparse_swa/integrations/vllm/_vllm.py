# SPDX-License-Identifier: Apache-2.0
"""What the drop-in takes from the vLLM it finds, each looked up when asked; vLLM is not a
dependency, so every lookup has an answer without it."""

from __future__ import annotations

import importlib
import sys
from typing import Any, Callable

BACKEND = "vllm.v1.attention.backend"
SPARSE_SWA = "vllm.v1.attention.backends.mla.sparse_swa"


def attr(module: str, name: str, default: Any = None) -> Any:
    """vllm's `module.name`, or default when vLLM (or that module or name) is not there."""
    try:
        return getattr(importlib.import_module(module), name, default)
    except ImportError:
        return default


def builder_base() -> type:
    """The class the drop-in's builders derive from: vLLM's DeepseekSparseSWAMetadataBuilder
    (so vLLM's model state hands them replay_start), else its AttentionMetadataBuilder, else
    object."""
    for module, name in ((SPARSE_SWA, "DeepseekSparseSWAMetadataBuilder"),
                         (BACKEND, "AttentionMetadataBuilder")):
        cls = attr(module, name)
        if isinstance(cls, type):
            return cls
    return object


def attention_builder_init() -> Callable[..., None] | None:
    """AttentionMetadataBuilder.__init__ (the drop-in skips vLLM's SWA builder's own)."""
    cls = attr(BACKEND, "AttentionMetadataBuilder")
    return cls.__init__ if isinstance(cls, type) else None


def cg_support(level: str) -> Any:
    """AttentionCGSupport.<level>, or None without vLLM."""
    return getattr(attr(BACKEND, "AttentionCGSupport"), level, None)


def max_decode_query_len() -> Callable[[Any], int] | None:
    """vLLM's own decode-threshold rule (vLLM 0.33), or None where it has none."""
    fn = attr(BACKEND, "max_decode_query_len")
    return fn if callable(fn) else None


def vision_config_class() -> type | None:
    """The config class whose instances vLLM's SWA builder widens prefill rows for (0.33:
    transformers' DeepseekV4Config, imported by its sparse_swa module); None where vLLM's
    builder widens for any config with vision layers (the seed's) or vLLM is absent."""
    module = sys.modules.get(SPARSE_SWA)
    if module is None:
        try:
            module = importlib.import_module(SPARSE_SWA)
        except ImportError:
            return None
    cls = getattr(module, "DeepseekV4Config", None)
    return cls if isinstance(cls, type) else None


def platform() -> Any:
    return attr("vllm.platforms", "current_platform")


def tile_sched_factory() -> tuple[bool, Callable[[], Any] | None]:
    """(whether this platform's FlashMLA decode takes plan holders, vLLM's maker of an empty
    one). vLLM makes none on ROCm, XPU and SM12x, and its CPU builder means none either; without
    vLLM the maker is None (the holders are then the layer types' names)."""
    p = platform()
    if p is not None:
        for check, arg in (("is_rocm", ()), ("is_xpu", ()), ("is_cpu", ()),
                           ("is_device_capability_family", (120,))):
            fn = getattr(p, check, None)
            if fn is not None and fn(*arg):
                return False, None
    get_mla_metadata = attr("vllm.v1.attention.ops.flashmla", "get_mla_metadata")
    if get_mla_metadata is None:
        return True, None
    return True, lambda: get_mla_metadata()[0]


def pcp_group() -> Any:
    """vLLM's prefill-context-parallel group (only asked for when its size is above 1)."""
    get = attr("vllm.distributed", "get_pcp_group")
    if get is None:
        raise ValueError("vllm_config.parallel_config.prefill_context_parallel_size: expected 1 "
                         "without vllm.distributed.get_pcp_group, got a larger size")
    return get()
