#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""vLLM 0.33's own SWA metadata builders, runnable without vLLM: the upstream files of
../shared/upstream/vllm-0.33.0 (or the carried .shared/upstream/vllm-0.33.0) are loaded as they
are, read at run time; the other vllm modules they import are minimal stand-ins made here. Real:

  vllm/v1/attention/backends/mla/sparse_swa.py        DeepseekSparseSWAMetadataBuilder
  vllm/v1/attention/backend.py                        max_decode_query_len, CommonAttentionMetadata
  vllm/v1/attention/ops/metadata.py                   compute_token_to_req_indices
  vllm/v1/attention/backends/mla/compressor_utils.py  get_dspark_swa_index_width
  vllm/transformers_utils/deepseek_v4_utils.py        get_compress_ratios
  vllm/models/deepseek_v4{,1}/nvidia/{flashmla,flashinfer_sparse}.py, deepseek_v41/sparse_mla.py
                                                      the backend and builder subclasses

Everything else under vllm (the attention layers' kernels and ops these model files import) is
an empty stand-in that only has to let the class definitions run. Needs torch and triton; on a
CPU, set TRITON_INTERPRET=1 in the environment before Triton is imported (the kernels then run
in Triton's interpreter).

  python3 scripts/gpu/vllm033_builder.py run CASE.json [...]   # each case's metadata as JSON

A case is a batch file of scripts/gpu/random_batches.py --vllm033 (config, batch with
replay_start, the vllm033 section naming the model and builder, draft_update).
"""
from __future__ import annotations

import dataclasses
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import json
import os
import sys
import types
from pathlib import Path

import torch
import triton
import triton.language as tl

REPO = Path(__file__).resolve().parents[2]
RELEASE = "vllm-0.33.0"
# The upstream modules loaded as they are (paths inside the upstream tree).
REAL = (
    "vllm.transformers_utils.deepseek_v4_utils",
    "vllm.v1.attention.ops.metadata",
    "vllm.v1.attention.backend",
    "vllm.v1.attention.backends.mla.compressor_utils",
    "vllm.v1.attention.backends.mla.sparse_swa",
    "vllm.models.deepseek_v4.nvidia.flashmla",
    "vllm.models.deepseek_v4.nvidia.flashinfer_sparse",
    "vllm.models.deepseek_v41.sparse_mla",
    "vllm.models.deepseek_v41.nvidia.flashmla",
    "vllm.models.deepseek_v41.nvidia.flashinfer_sparse",
)
# (model, builder kind) -> (module, vLLM's builder class)
BUILDERS = {
    ("v4", "base"): ("vllm.v1.attention.backends.mla.sparse_swa",
                     "DeepseekSparseSWAMetadataBuilder"),
    ("v4", "flashmla"): ("vllm.models.deepseek_v4.nvidia.flashmla",
                         "DeepseekSparseSWAFlashMLAMetadataBuilder"),
    ("v4", "flashinfer"): ("vllm.models.deepseek_v4.nvidia.flashinfer_sparse",
                           "DeepseekSparseSWAFlashInferMetadataBuilder"),
    ("v41", "base"): ("vllm.models.deepseek_v41.sparse_mla", "DeepseekV41SparseSWAMetadataBuilder"),
    ("v41", "flashmla"): ("vllm.models.deepseek_v41.nvidia.flashmla",
                          "DeepseekSparseSWAFlashMLAMetadataBuilder"),
    ("v41", "flashinfer"): ("vllm.models.deepseek_v41.nvidia.flashinfer_sparse",
                            "DeepseekSparseSWAFlashInferMetadataBuilder"),
}
# (model, builder kind) -> the SWA backend vLLM's attention layers take it from
BACKENDS = {
    ("v4", "flashmla"): ("vllm.models.deepseek_v4.nvidia.flashmla",
                         "DeepseekSparseSWAFlashMLABackend"),
    ("v4", "flashinfer"): ("vllm.models.deepseek_v4.nvidia.flashinfer_sparse",
                           "DeepseekSparseSWAFlashInferBackend"),
    ("v41", "flashmla"): ("vllm.models.deepseek_v41.nvidia.flashmla",
                          "DeepseekSparseSWAFlashMLABackend"),
    ("v41", "flashinfer"): ("vllm.models.deepseek_v41.nvidia.flashinfer_sparse",
                            "DeepseekSparseSWAFlashInferBackend"),
}


def upstream_root(explicit: str | os.PathLike | None = None) -> Path | None:
    """The vLLM 0.33 tree: explicit, $SPARSE_SWA_VLLM033, .shared/upstream or ../shared/upstream."""
    candidates = [explicit, os.environ.get("SPARSE_SWA_VLLM033"),
                  REPO / ".shared" / "upstream" / RELEASE,
                  REPO.parent / "shared" / "upstream" / RELEASE]
    for c in candidates:
        if c and (Path(c) / "vllm/v1/attention/backends/mla/sparse_swa.py").exists():
            return Path(c)
    return None


# ---------------------------------------------------------------- stand-ins
def cdiv(a, b):
    return -(-a // b)


def next_power_of_2(n):
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


class VllmTritonJitKernel:
    """vLLM's Triton kernel wrapper: a subclass holds `kernel` and a @kernel_launcher __call__."""

    def __class_getitem__(cls, item):
        return cls


def kernel_launcher(fn):
    """Runs the launch spec __call__ returns: grid and the kernel's extra arguments; the other
    kernel parameters come from __call__'s arguments of the same name (an `_ptr` parameter from
    the argument without the suffix)."""
    sig = inspect.signature(fn)

    def launch(self, *args, **kwargs):
        bound = sig.bind(self, *args, **kwargs)
        bound.apply_defaults()
        given = dict(bound.arguments)
        given.pop("self")
        grid, extra = fn(self, *args, **kwargs)
        call = {}
        names = getattr(self.kernel, "arg_names", None)  # Triton's JIT and interpreter
        for name in names or inspect.signature(self.kernel.fn).parameters:
            for key, pool in ((name, extra), (name, given), (name.removesuffix("_ptr"), given),
                              (name.lower(), given)):
                if key in pool:
                    call[name] = pool[key]
                    break
            else:
                raise KeyError(f"kernel parameter {name} has no argument")
        self.kernel[grid](**call)

    return launch


class Platform:
    """A CUDA platform of none of the families vLLM treats apart."""

    def __getattr__(self, name):
        if name.startswith("is_"):
            return lambda *a, **k: False
        raise AttributeError(name)


class FlashMLASchedMeta:
    def __init__(self):
        self.have_initialized = False
        self.tile_scheduler_metadata = None
        self.num_splits = None


class Spec:
    """A KV-cache spec: the keyword arguments as attributes."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


class SlidingWindowMLASpec(Spec):
    pass


class MLAAttentionSpec(Spec):
    pass


class PcpGroup:
    """Prefill context parallelism of `size` ranks seen from `rank`: all_gather stacks the
    ranks' tensors, rank i's being this rank's + 1000 * (i - rank)."""

    def __init__(self, size=1, rank=0):
        self.world_size, self.rank_in_group = size, rank

    def all_gather(self, x, dim=0):
        return torch.cat([x + 1000 * (i - self.rank_in_group) for i in range(self.world_size)],
                         dim=dim)


PCP = PcpGroup()


def split_decodes_and_prefills(cm, decode_threshold=1, require_uniform=False,
                               treat_short_extends_as_decodes=True):
    """vLLM's split of a decode-first batch: the leading requests with query length <= the
    threshold are decodes (CUDA-graph padding tokens count with them when nothing prefills)."""
    num_reqs, num_tokens = cm.num_reqs, cm.num_actual_tokens
    if cm.max_query_len <= decode_threshold:
        return num_reqs, 0, num_tokens, 0
    qsl = cm.query_start_loc_cpu
    is_prefill = (qsl[1:] - qsl[:-1]) > decode_threshold
    if not bool(is_prefill.any()):
        return num_reqs, 0, num_tokens, 0
    first = int(is_prefill.int().argmax().item())
    num_decode_tokens = int(qsl[first].item())
    return first, num_reqs - first, num_decode_tokens, num_tokens - num_decode_tokens


class DeepseekV4Config:
    """transformers' DeepseekV4Config (a stand-in): the keyword arguments as attributes."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


class _StubMeta(type):
    def __getattr__(cls, name):
        return _stub_attr(name)

    def __getitem__(cls, item):
        return cls

    def __call__(cls, *args, **kwargs):
        if cls.__dict__.get("_leaf") and len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]  # a decorator hands back what it decorates
        return super().__call__(*args, **kwargs)


class _Stub(metaclass=_StubMeta):
    """Anything a model file imports and does not need here: subclassable, callable (as a
    decorator it hands back what it decorates), subscriptable."""

    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        return args[0] if len(args) == 1 and callable(args[0]) and not kwargs else _Stub()

    def __getattr__(self, name):
        return _stub_attr(name)


def stub_class(name):
    return _StubMeta(name, (_Stub,), {"_leaf": True})


def _stub_attr(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return stub_class(name)


def _module(name, attrs=None, package=False):
    m = types.ModuleType(name)
    m.__dict__.update(attrs or {})
    if package:
        m.__path__ = []
    return m


def stand_ins():
    """{module: its attributes}, the vllm modules the builder files import."""
    quant_keys = {k: object() for k in ("kFp8Dynamic64Sym", "kFp8Dynamic128Sym",
                                        "kFp8StaticTensorSym", "kNvfp4Dynamic")}
    return {
        "vllm.config": dict(CacheConfig=object, VllmConfig=object,
                            get_current_vllm_config=lambda: None),
        "vllm.model_executor.layers.attention_layer_base": dict(
            AttentionLayerBase=type("AttentionLayerBase", (), {})),
        "vllm.model_executor.layers.quantization.utils.quant_utils": quant_keys,
        "vllm.model_executor.warmup.jit_warmup": dict(
            WarmupIntRange=object, kernel_launcher=kernel_launcher, zip_inputs=lambda *a, **k: a),
        "vllm.model_executor.warmup.jit_warmup_triton_helper": dict(
            LaunchSpec=tuple, TritonWarmupTensor=object, VllmTritonJitKernel=VllmTritonJitKernel,
            triton_scalar_specialization_rep=lambda *a, **k: None),
        "vllm.platforms": dict(current_platform=Platform()),
        "vllm.triton_utils": dict(tl=tl, triton=triton),
        "vllm.utils.math_utils": dict(cdiv=cdiv, next_power_of_2=next_power_of_2,
                                      round_up=lambda x, m: cdiv(x, m) * m),
        "vllm.v1.attention.backends.utils": dict(
            split_decodes_and_prefills=split_decodes_and_prefills),
        "vllm.v1.attention.ops.flashmla": dict(
            FlashMLASchedMeta=FlashMLASchedMeta, get_mla_metadata=lambda *a, **k: (
                FlashMLASchedMeta(), None),
            flash_mla_sparse_fwd=_Stub(), flash_mla_with_kvcache=_Stub()),
        "vllm.v1.kv_cache_interface": dict(
            KVCacheSpec=Spec, AttentionSpec=Spec, MLAAttentionSpec=MLAAttentionSpec,
            SlidingWindowMLASpec=SlidingWindowMLASpec, KVCacheLayout=stub_class("KVCacheLayout"),
            get_kv_quant_mode=lambda s: None),
        "vllm.distributed": dict(get_pcp_group=lambda: PCP),
    }


class _Loader(importlib.abc.Loader):
    def __init__(self, attrs=None, package=False, stub=False):
        self.attrs, self.package, self.stub = attrs, package, stub

    def create_module(self, spec):
        m = _module(spec.name, self.attrs, self.package)
        if self.stub:
            m.__getattr__ = _stub_attr
        return m

    def exec_module(self, module):
        pass


class VllmFinder(importlib.abc.MetaPathFinder):
    """Resolves every vllm module: REAL ones from the upstream tree, stand_ins() as given,
    packages as empty packages, anything else as an empty stand-in."""

    def __init__(self, root: Path):
        self.root, self.attrs = root, stand_ins()

    def find_spec(self, name, path=None, target=None):
        if name != "vllm" and not name.startswith("vllm."):
            return None
        if name in REAL:
            file = self.root / (name.replace(".", "/") + ".py")
            return importlib.util.spec_from_file_location(name, file)
        if name in self.attrs:  # a package too: its other submodules are empty stand-ins
            return importlib.machinery.ModuleSpec(name, _Loader(self.attrs[name], package=True,
                                                                stub=True), is_package=True)
        prefix = name + "."
        if any(m.startswith(prefix) for m in (*REAL, *self.attrs)) or name == "vllm":
            return importlib.machinery.ModuleSpec(name, _Loader(package=True), is_package=True)
        return importlib.machinery.ModuleSpec(name, _Loader(package=True, stub=True),
                                              is_package=True)


_FINDER: VllmFinder | None = None


def load(root: Path | None = None, models: bool = True) -> types.SimpleNamespace:
    """Loads vLLM 0.33's builder (and, with models, the DeepSeek-V4/V4.1 model files that
    subclass it) as the modules `vllm.*`; unload() takes them away again."""
    global _FINDER
    root = root or upstream_root()
    if root is None:
        raise FileNotFoundError(f"no {RELEASE} tree in .shared/upstream or ../shared/upstream")
    unload()
    _FINDER = VllmFinder(root)
    sys.meta_path.insert(0, _FINDER)
    saved = sys.modules.get("transformers")
    # 0.33's builder imports transformers' DeepseekV4Config; it keeps the stand-in it got.
    sys.modules["transformers"] = _module("transformers", {"DeepseekV4Config": DeepseekV4Config})
    try:
        names = REAL if models else REAL[:5]
        mods = {n: importlib.import_module(n) for n in names}
    finally:
        if saved is None:
            sys.modules.pop("transformers", None)
        else:
            sys.modules["transformers"] = saved
    return types.SimpleNamespace(root=root, modules=mods, **{
        n.rsplit(".", 1)[1]: m for n, m in mods.items() if "models" not in n})


def unload():
    global _FINDER
    if _FINDER is not None and _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)
    _FINDER = None
    for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
        del sys.modules[name]


# ---------------------------------------------------------------- vLLM objects of a case
class HFConfig:
    """A model config of no transformers class (DeepSeek-V4.1, remote code)."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


def vllm_objects(case):
    """(kv_cache_spec, vllm_config) of a case: its config and vllm033 section."""
    c = {"num_speculative_tokens": 0, "speculative_method": "none", "parallel_drafting": False,
         "max_image_tokens": 0, "compress_ratios": [1], **case["config"]}
    v = case.get("vllm033", {})
    ns = types.SimpleNamespace
    spec = None
    if c["speculative_method"] != "none":
        dspark = c["speculative_method"] == "dspark"
        spec = ns(num_speculative_tokens=c["num_speculative_tokens"],
                  parallel_drafting=c["parallel_drafting"], use_dspark=lambda: dspark)
    hf_fields = dict(v.get("hf_config", {}))
    cls = DeepseekV4Config if hf_fields.pop("class", "DeepseekV4Config") == "DeepseekV4Config" \
        else HFConfig
    if (v.get("model", "v4") == "v4" and "compress_rates" not in hf_fields
            and "compress_ratios" not in hf_fields):
        hf_fields["compress_ratios"] = c["compress_ratios"]
    mi = c["max_image_tokens"]
    hf = cls(sliding_window=c["window_size"], vision_max_n_token=mi,
             vision_n_layers=1 if mi > 0 else 0, **hf_fields)
    pcp = v.get("pcp", {"size": 1, "rank": 0})
    vc = ns(model_config=ns(max_model_len=c["max_model_len"], hf_config=hf),
            scheduler_config=ns(max_num_batched_tokens=c["max_num_batched_tokens"],
                                max_num_seqs=c["max_num_seqs"]),
            speculative_config=spec, use_v2_model_runner=v.get("model_runner_v2", False),
            parallel_config=ns(prefill_context_parallel_size=pcp["size"],
                               decode_context_parallel_size=1),
            attention_config=ns(use_non_causal=c["speculative_method"] == "dspark"))
    PCP.world_size, PCP.rank_in_group = pcp["size"], pcp["rank"]
    kv = SlidingWindowMLASpec(head_size=512, tokens_per_state=1, block_size=c["block_size"])
    return kv, vc


def vllm_builder_cls(loaded, case):
    v = case.get("vllm033", {})
    module, name = BUILDERS[(v.get("model", "v4"), v.get("builder", "base"))]
    return getattr(loaded.modules[module], name)


def common(loaded, batch, device):
    """vLLM's CommonAttentionMetadata of a batch (CUDA-graph padding tokens past
    query_start_loc[R]; positions 0 for them)."""
    qsl = torch.tensor(batch["query_start_loc"], dtype=torch.int32)
    seq = torch.tensor(batch["seq_lens"], dtype=torch.int32)
    bt = torch.tensor(batch["block_table"], dtype=torch.int32)
    slots = torch.tensor(batch["slot_mapping"], dtype=torch.int64)
    qlens = (qsl[1:] - qsl[:-1]).tolist()
    positions = torch.zeros(len(slots), dtype=torch.int64)
    for r, q in enumerate(qlens):
        s, start = int(seq[r]), int(qsl[r])
        positions[start:start + q] = torch.arange(s - q, s)
    mm = {int(r): [tuple(s) for s in spans] for r, spans in batch.get("image_spans", {}).items()}
    return loaded.backend.CommonAttentionMetadata(
        query_start_loc=qsl.to(device), query_start_loc_cpu=qsl, seq_lens=seq.to(device),
        num_reqs=len(qlens), num_actual_tokens=int(batch.get("num_actual_tokens", len(slots))),
        max_query_len=max(qlens, default=0), max_seq_len=int(seq.max()) if len(seq) else 0,
        block_table_tensor=bt.to(device), slot_mapping=slots.to(device),
        causal=batch.get("causal", True), seq_lens_cpu_upper_bound=seq,
        mm_req_doc_ranges=mm or None, positions=positions.to(device))


def replay_start(batch, device):
    rs = batch.get("replay_start")
    return None if rs is None else torch.tensor(rs, dtype=torch.int32, device=device)


def apply_draft_update(cm, update):
    """The engine's in-place changes between draft steps: device seq_lens, slot_mapping and
    query_start_loc (the host copies stay as the build left them)."""
    for key, attr, dtype in (("seq_lens", "seq_lens", torch.int32),
                             ("slot_mapping", "slot_mapping", torch.int64),
                             ("query_start_loc", "query_start_loc", torch.int32)):
        if key in update:
            t = getattr(cm, attr)
            t.copy_(torch.tensor(update[key], dtype=dtype, device=t.device))


def same_value(a, b):
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                and a.dtype == b.dtype and a.shape == b.shape and a.device == b.device
                and torch.equal(a.cpu(), b.cpu()))
    return type(a) is type(b) and a == b


def differences(ref, ours, plan_requests=()):
    """Names of the metadata fields (and chunk plans) where vLLM's and ours differ."""
    bad = []
    for f in dataclasses.fields(ref):
        a, b = getattr(ref, f.name), getattr(ours, f.name)
        if f.name.startswith("tile_sched_"):
            ok = (a is None) == (b is None) and (a is None or type(a) is type(b))
        elif f.name in ("prefill_left_visible", "prefill_right_visible") and a is not None:
            # Only the prefill rows are defined (the decode rows of the buffer are stale).
            td = ref.num_decode_tokens
            ok = b is not None and a.shape == b.shape and same_value(a[td:], b[td:])
        else:
            ok = same_value(a, b)
        if not ok:
            bad.append(f.name)
    for ratio, chunk in plan_requests:
        if ref.get_prefill_chunk_plan(ratio, chunk) != ours.get_prefill_chunk_plan(ratio, chunk):
            bad.append(f"get_prefill_chunk_plan({ratio}, {chunk})")
    return bad


def as_json(md):
    """The metadata's fields as JSON values (tensors as lists, plan holders as present or not)."""
    out = {}
    for f in dataclasses.fields(md):
        v = getattr(md, f.name)
        if f.name.startswith("tile_sched_"):
            v = v is not None
        elif isinstance(v, torch.Tensor):
            v = v.detach().cpu().tolist()
        elif isinstance(v, dict):
            v = sorted(v)
        out[f.name] = v
    return out


def run_case(loaded, case, device):
    kv, vc = vllm_objects(case)
    builder = vllm_builder_cls(loaded, case)(kv, ["layer.0"], vc, device)
    cm = common(loaded, case["batch"], device)
    md = builder.build(0, cm, replay_start=replay_start(case["batch"], device))
    out = {"build": as_json(md), "chunk_plans": [
        {**r, "plan": [list(p) for p in md.get_prefill_chunk_plan(r["compress_ratio"],
                                                                  r["chunk_size"])]}
        for r in case.get("chunk_plan_requests", [])]}
    if case.get("draft_update") and md.num_decode_tokens:
        apply_draft_update(cm, case["draft_update"])
        builder.update_draft_decode_metadata(md)
        out["after_draft_update"] = as_json(md)
    return out


def main():
    if len(sys.argv) < 3 or sys.argv[1] != "run":
        print(__doc__)
        sys.exit(2)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    loaded = load()
    for f in sys.argv[2:]:
        print(json.dumps(run_case(loaded, json.loads(Path(f).read_text()), device)))


if __name__ == "__main__":
    main()
