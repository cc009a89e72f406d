# SPDX-License-Identifier: Apache-2.0
"""Drop-ins for vLLM 0.33: the DeepSeek-V4 / V4.1 SWA metadata builders
(DeepseekSparseSWAMetadataBuilder and its FlashMLA / FlashInfer subclasses), backed by
sparse_swa.MetadataBuilder (the CUDA backend for CUDA tensors, the CPU one for host tensors), and
the attention of the DeepSeek-V4 FlashMLA layer (DeepseekV4FlashMLAAttention) on
sparse_swa.sparse_attention (attention.py). README.md#using-it-from-vllm shows how a running vLLM
switches to them:

    from sparse_swa.integrations.vllm import install
    install()   # both; install(targets=SWA_BUILDER_TARGETS) or ATTENTION_TARGETS for one

or directly:

    builder = SparseSWAFlashMLAMetadataBuilder(kv_cache_spec, layer_names, vllm_config, device)
    md = builder.build(common_prefix_len, common_attn_metadata, replay_start=None)

The constructor reads what vLLM's builder reads: kv_cache_spec.block_size; from vllm_config
model_config.max_model_len, model_config.hf_config (sliding_window, compress_ratios or
compress_rates + layer_types + num_nextn_predict_layers, vision_max_n_token, vision_n_layers),
scheduler_config (max_num_batched_tokens, max_num_seqs), speculative_config
(num_speculative_tokens, parallel_drafting, use_dspark()), use_v2_model_runner and, for V4.1,
parallel_config.prefill_context_parallel_size. build() reads from common_attn_metadata:
query_start_loc(_cpu), seq_lens, seq_lens_cpu_upper_bound, block_table_tensor, slot_mapping,
causal, max_query_len, mm_req_doc_ranges (and positions under PCP).

vLLM is not a dependency: it is imported only for what it provides when present (the base
builder class, so vLLM's model state hands the builder replay_start; AttentionCGSupport;
max_decode_query_len to check the decode threshold against; the DeepseekV4Config its builder
widens image rows for; get_mla_metadata for the tile_sched_* holders and the platform checks).
Without vLLM the tile_sched_* fields hold the layer type's name.

Lifetime (as vLLM's builder): the metadata's index arrays alias the builder's persistent
buffers and are rewritten by its next build(); get_prefill_chunk_plan() must be called before
that next build (it raises ValueError after).
"""

from .attention import SparseSWAFlashMLAAttention
from .builder import (
    SparseSWAFlashInferMetadataBuilder,
    SparseSWAFlashMLAMetadataBuilder,
    SparseSWAMetadataBuilder,
    SparseSWAV41FlashInferMetadataBuilder,
    SparseSWAV41FlashMLAMetadataBuilder,
    SparseSWAV41MetadataBuilder,
)
from .config import LAYER_TYPES, builder_config, compress_ratios
from .install import (
    ATTENTION_TARGETS,
    SWA_BUILDER_TARGETS,
    TARGETS,
    Installation,
    Patch,
    Target,
    UnsupportedVllmError,
    install,
    uninstall,
)
from .metadata import SparseSWAMetadata
from .shared import SharedSWAMetadataBuilds

__all__ = [
    "ATTENTION_TARGETS", "LAYER_TYPES", "SWA_BUILDER_TARGETS", "TARGETS", "Installation",
    "Patch", "SharedSWAMetadataBuilds", "SparseSWAFlashInferMetadataBuilder",
    "SparseSWAFlashMLAAttention", "SparseSWAFlashMLAMetadataBuilder", "SparseSWAMetadata",
    "SparseSWAMetadataBuilder", "SparseSWAV41FlashInferMetadataBuilder",
    "SparseSWAV41FlashMLAMetadataBuilder", "SparseSWAV41MetadataBuilder", "Target",
    "UnsupportedVllmError", "builder_config", "compress_ratios", "install", "uninstall",
]
