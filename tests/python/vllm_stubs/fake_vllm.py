# SPDX-License-Identifier: Apache-2.0
"""A stand-in of vLLM 0.33's class structure around the DeepSeek-V4 SWA builder, without torch:
the module paths, class names, bases, CUDA-graph support levels, get_builder_cls() and the
attention classes' swa_backend_cls of vLLM 0.33 (docs: README.md#using-it-from-vllm), and the
FlashMLA attention classes' methods (forward_mqa, _forward_decode, _forward_prefill,
get_padded_num_q_heads, PREFILL_CHUNK_SIZE) with their modules' get_forward_context and
current_workspace_manager. vLLM's own builders and attention methods refuse to run here, so a
test sees at once whose vLLM got.

    modules = make(root="vllm")      # {name: module}, not yet in sys.modules
    with installed(modules): ...     # in sys.modules for the block
"""

import contextlib
import enum
import importlib.machinery
import sys
import types


class AttentionCGSupport(enum.Enum):
    ALWAYS = 3
    UNIFORM_BATCH = 2
    UNIFORM_SINGLE_TOKEN_DECODE = 1
    NEVER = 0


class VllmBuilderRan(AssertionError):
    """vLLM's own SWA builder (or attention method) was used."""


def _refuse(self, *args, **kwargs):
    raise VllmBuilderRan(f"vLLM's own {type(self).__name__} ran")


def _flashmla_attention_methods():
    """vLLM 0.33's DeepseekV4FlashMLAAttention methods the drop-in replaces or requires (the
    parameters as upstream's), each refusing to run."""

    def forward_mqa(self, q, kv, positions, output):
        _refuse(self)

    def _forward_decode(self, q, kv_cache, swa_metadata, attn_metadata, swa_only, output):
        _refuse(self)

    def _forward_prefill(self, q, positions, compressed_k_cache, swa_k_cache, output,
                         attn_metadata, swa_metadata):
        _refuse(self)

    def get_padded_num_q_heads(cls, num_heads):
        return 64 if num_heads <= 64 else 128

    return dict(forward_mqa=forward_mqa, _forward_decode=_forward_decode,
                _forward_prefill=_forward_prefill, PREFILL_CHUNK_SIZE=4,
                get_padded_num_q_heads=classmethod(get_padded_num_q_heads))


def _no_forward_context():
    raise VllmBuilderRan("no forward context in the stand-in")


def _module(name, attrs, package=False):
    m = types.ModuleType(name)
    m.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=package)
    if package:
        m.__path__ = []
    m.__dict__.update(attrs)
    return m


def _cls(name, bases, module, **attrs):
    return type(name, bases, {"__module__": module, **attrs})


def _threshold(vllm_config):
    """The decode threshold rule of vLLM 0.33: 1 + k, k more for parallel drafting on the V1
    model runner."""
    spec = vllm_config.speculative_config
    if spec is None or spec.num_speculative_tokens is None:
        return 1
    k = spec.num_speculative_tokens
    v1_parallel = spec.parallel_drafting and not vllm_config.use_v2_model_runner
    return 1 + k + (k if v1_parallel else 0)


def make(root="vllm", v4=True, v41=True, missing=(), extra_methods=None, attention=None):
    """{module name: module} of the stand-in. v4 / v41: whether the model packages exist;
    missing: class or module-function names left out; extra_methods: {builder class name:
    [method names]} that vLLM's class defines beyond 0.33's; attention: {name: value} replacing
    (None: removing) members of the FlashMLA attention classes."""
    extra_methods = extra_methods or {}
    mods = {}

    def module(rel, attrs, package=False):
        name = f"{root}.{rel}" if rel else root
        parts = name.split(".")
        for i in range(1, len(parts)):
            parent = ".".join(parts[:i])
            mods.setdefault(parent, _module(parent, {}, package=True))
        mods[name] = _module(name, {k: v for k, v in attrs.items() if k not in missing},
                             package)
        return name

    def builder(name, bases, where, **attrs):
        for method in extra_methods.get(name, ()):
            attrs[method] = _refuse
        return _cls(name, bases, where, **attrs)

    class AttentionMetadataBuilder:
        _cudagraph_support = AttentionCGSupport.NEVER
        reorder_batch_threshold = None

        def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
            self.kv_cache_spec, self.layer_names = kv_cache_spec, layer_names
            self.vllm_config, self.device = vllm_config, device

    class AttentionBackend:
        @staticmethod
        def get_builder_cls():
            raise NotImplementedError

    module("v1.attention.backend", dict(
        AttentionCGSupport=AttentionCGSupport, AttentionBackend=AttentionBackend,
        AttentionMetadataBuilder=AttentionMetadataBuilder, max_decode_query_len=_threshold))

    swa = f"{root}.v1.attention.backends.mla.sparse_swa"
    base = builder("DeepseekSparseSWAMetadataBuilder", (AttentionMetadataBuilder,), swa,
                   _cudagraph_support=AttentionCGSupport.UNIFORM_BATCH,
                   supports_draft_decode_metadata_update=True, __init__=_refuse, build=_refuse,
                   update_draft_decode_metadata=_refuse, build_tile_scheduler=_refuse)
    base_backend = _cls("DeepseekSparseSWABackend", (AttentionBackend,), swa,
                        get_builder_cls=staticmethod(lambda: base))
    module("v1.attention.backends.mla.sparse_swa", dict(
        DeepseekV4Config=_cls("DeepseekV4Config", (), "transformers"),
        DeepseekSparseSWAMetadataBuilder=base, DeepseekSparseSWABackend=base_backend))

    class FlashMLASchedMeta:
        pass

    module("v1.attention.ops.flashmla", dict(
        FlashMLASchedMeta=FlashMLASchedMeta,
        get_mla_metadata=lambda *a, **k: (FlashMLASchedMeta(), None)))
    module("platforms", dict(current_platform=types.SimpleNamespace(
        is_rocm=lambda: False, is_xpu=lambda: False, is_cpu=lambda: False,
        is_device_capability_family=lambda family: False)), package=True)

    def nvidia(model, swa_base, attention_names):
        """The FlashMLA and FlashInfer modules of one model: builder, backend, attention."""
        for kind, backend_name, builder_name, extra in (
                ("flashmla", "DeepseekSparseSWAFlashMLABackend",
                 "DeepseekSparseSWAFlashMLAMetadataBuilder", {}),
                ("flashinfer_sparse", "DeepseekSparseSWAFlashInferBackend",
                 "DeepseekSparseSWAFlashInferMetadataBuilder",
                 {"_fill_noncausal_decode_lens": _refuse} if model == "deepseek_v41" else {})):
            where = f"{root}.models.{model}.nvidia.{kind}"
            b = builder(builder_name, (swa_base,), where,
                        _cudagraph_support=AttentionCGSupport.ALWAYS, **extra)
            backend = _cls(backend_name, (base_backend,), where,
                           get_builder_cls=staticmethod(lambda b=b: b))
            attrs = {builder_name: b, backend_name: backend}
            members = {}
            if kind == "flashmla":
                members = {**_flashmla_attention_methods(), **(attention or {})}
                members = {k: v for k, v in members.items() if v is not None}
                attrs.update(get_forward_context=_no_forward_context,
                             current_workspace_manager=_no_forward_context)
            for name in attention_names[kind]:
                attrs[name] = _cls(name, (), where, swa_backend_cls=backend, **members)
            module(f"models.{model}.nvidia.{kind}", attrs)

    names = {"flashmla": ["DeepseekV4FlashMLAAttention"],
             "flashinfer_sparse": ["DeepseekV4FlashInferMLAAttention",
                                   "DeepseekV4FlashInferSM120Attention"]}
    if v4:
        nvidia("deepseek_v4", base, names)
    if v41:
        where = f"{root}.models.deepseek_v41.sparse_mla"
        v41_base = builder("DeepseekV41SparseSWAMetadataBuilder", (base,), where,
                           __init__=_refuse, build=_refuse)
        module("models.deepseek_v41.sparse_mla", {"DeepseekV41SparseSWAMetadataBuilder": v41_base})
        nvidia("deepseek_v41", v41_base, names)
    return mods


@contextlib.contextmanager
def installed(mods):
    """The stand-in's modules in sys.modules for the block (none of them may be there)."""
    clash = [n for n in mods if n in sys.modules]
    if clash:
        raise RuntimeError(f"modules already imported: {clash}")
    sys.modules.update(mods)
    try:
        yield mods
    finally:
        for name in mods:
            sys.modules.pop(name, None)
