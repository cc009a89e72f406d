# SPDX-License-Identifier: Apache-2.0
"""install(): hands the drop-in's builders and attention to a running vLLM
(README.md#using-it-from-vllm).

Each Target names a class of vLLM that install() replaces and how, by kind (its patcher in
_PATCHERS): "swa_builder" makes a backend's get_builder_cls() return the drop-in's builder for
it; "attention" puts the drop-in's attention methods on vLLM's attention layer class."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from . import attention as a
from . import builder as b

_VLLM_BASE_BUILDER = "DeepseekSparseSWAMetadataBuilder"


class UnsupportedVllmError(RuntimeError):
    """The vLLM found has none of the classes install() replaces."""


@dataclass(frozen=True)
class Target:
    """One class of the running vLLM that install() replaces. module is relative to the vllm
    package. Kind "swa_builder": cls is an SWA backend whose get_builder_cls() should return
    `replacement` (vLLM's own builder there is `replaces`). Kind "attention": cls (= replaces)
    is an attention layer class that gets `replacement`'s methods."""

    kind: str
    module: str
    cls: str
    replaces: str
    replacement: type

    def where(self, root: str = "vllm") -> str:
        return f"{root}.{self.module}.{self.cls}"


# The SWA backends of vLLM 0.33's DeepSeek-V4 and V4.1 attention layers on CUDA (their
# swa_backend_cls); the base DeepseekSparseSWABackend stays: on ROCm and CPU it hands out
# builders of other layouts.
SWA_BUILDER_TARGETS: tuple[Target, ...] = (
    Target("swa_builder", "models.deepseek_v4.nvidia.flashmla", "DeepseekSparseSWAFlashMLABackend",
           "DeepseekSparseSWAFlashMLAMetadataBuilder", b.SparseSWAFlashMLAMetadataBuilder),
    Target("swa_builder", "models.deepseek_v4.nvidia.flashinfer_sparse",
           "DeepseekSparseSWAFlashInferBackend", "DeepseekSparseSWAFlashInferMetadataBuilder",
           b.SparseSWAFlashInferMetadataBuilder),
    Target("swa_builder", "models.deepseek_v41.nvidia.flashmla",
           "DeepseekSparseSWAFlashMLABackend", "DeepseekSparseSWAFlashMLAMetadataBuilder",
           b.SparseSWAV41FlashMLAMetadataBuilder),
    Target("swa_builder", "models.deepseek_v41.nvidia.flashinfer_sparse",
           "DeepseekSparseSWAFlashInferBackend", "DeepseekSparseSWAFlashInferMetadataBuilder",
           b.SparseSWAV41FlashInferMetadataBuilder),
)

# The attention layer of vLLM 0.33's DeepSeek-V4 FlashMLA path (CUDA, fp8_ds_mla caches).
ATTENTION_TARGETS: tuple[Target, ...] = (
    Target("attention", "models.deepseek_v4.nvidia.flashmla", "DeepseekV4FlashMLAAttention",
           "DeepseekV4FlashMLAAttention", a.SparseSWAFlashMLAAttention),
)
# What install() takes by default: both drop-ins.
TARGETS: tuple[Target, ...] = SWA_BUILDER_TARGETS + ATTENTION_TARGETS
# What install() says it looked for, per kind.
_KIND_NAMES = {"swa_builder": "DeepSeek-V4 SWA backends",
               "attention": "DeepSeek-V4 FlashMLA attention layer"}


@dataclass
class Patch:
    """One replacement install() made: `owner` is vLLM's class it changed, `handed_out` what
    vLLM now gets (an instance of both the drop-in's class and vLLM's own `original_cls`; for an
    attention target the owner itself, with the drop-in's methods)."""

    target: Target
    owner: type
    original_cls: type
    handed_out: type
    restore: Callable[[], None] = field(repr=False)


@dataclass
class Installation:
    """What install() did: the patches (in target order) and, per target it left alone, why."""

    vllm: str
    patches: list[Patch]
    skipped: dict[str, str]

    def builder_cls(self, owner: type) -> type:
        """The builder class vLLM's backend `owner` now hands out."""
        for p in self.patches:
            if p.owner is owner:
                return p.handed_out
        raise KeyError(f"owner: expected a class install() patched, got {owner!r}")


_PATCHED: dict[type, Patch] = {}  # owner -> its patch, across calls (install is idempotent)
_HANDED_OUT: dict[tuple[type, type], type] = {}


def _uncovered_methods(replacement: type, vllm_cls: type) -> list[str]:
    """Public methods (and __init__) vLLM's builder classes define that the drop-in's class does
    not: handing the drop-in out would mix its state with vLLM's."""
    ours = {n for c in replacement.__mro__ if issubclass(c, b.SparseSWAMetadataBuilder)
            for n in vars(c)}
    missing = []
    for c in vllm_cls.__mro__:
        for name, value in vars(c).items():
            public = name == "__init__" or not name.startswith("_")
            if public and callable(getattr(value, "__func__", value)) and name not in ours:
                missing.append(f"{c.__name__}.{name}")
        if c.__name__ == _VLLM_BASE_BUILDER:
            break
    return missing


def _handed_out(replacement: type, vllm_cls: type) -> type:
    """The drop-in's class for vLLM's builder `vllm_cls`: the drop-in's methods first, vLLM's
    class among its bases (vLLM's isinstance checks hold), vLLM's CUDA-graph support level."""
    key = (replacement, vllm_cls)
    if key not in _HANDED_OUT:
        if not any(c.__name__ == _VLLM_BASE_BUILDER for c in vllm_cls.__mro__):
            raise TypeError(f"{vllm_cls.__qualname__} does not derive from {_VLLM_BASE_BUILDER}")
        missing = _uncovered_methods(replacement, vllm_cls)
        if missing:
            raise TypeError(f"vLLM's {', '.join(missing)} have no sparse_swa counterpart")
        attrs = {"__module__": __name__, "__doc__": replacement.__doc__,
                 "_cudagraph_support": getattr(vllm_cls, "_cudagraph_support", None)}
        bases = (replacement,) if issubclass(replacement, vllm_cls) else (replacement, vllm_cls)
        _HANDED_OUT[key] = type(replacement.__name__, bases, attrs)
    return _HANDED_OUT[key]


def _patch_swa_builder(target: Target, module: Any, owner: type) -> Patch:
    done = _PATCHED.get(owner)
    if done is not None and owner.get_builder_cls() is done.handed_out:
        if done.target.replacement is not target.replacement:
            raise TypeError(f"already patched for {done.target.where()}")
        return done
    vllm_cls = getattr(module, target.replaces, None)
    if not isinstance(vllm_cls, type):
        raise TypeError(f"no class {target.replaces} beside it")
    handed_out = _handed_out(target.replacement, vllm_cls)
    had_own = "get_builder_cls" in vars(owner)
    original = vars(owner).get("get_builder_cls")

    def get_builder_cls() -> type:
        return handed_out

    def restore() -> None:
        if had_own:
            owner.get_builder_cls = original
        else:
            del owner.get_builder_cls
        _PATCHED.pop(owner, None)

    owner.get_builder_cls = staticmethod(get_builder_cls)
    patch = Patch(target, owner, vllm_cls, handed_out, restore)
    _PATCHED[owner] = patch
    return patch


# What the drop-in's attention reads of vLLM 0.33's DeepseekV4FlashMLAAttention and its module
# (forward_mqa's parameters; the module functions vLLM's own forward_mqa calls).
_ATTENTION_METHODS = ("forward_mqa", "_forward_decode", "_forward_prefill",
                      "get_padded_num_q_heads")
_FORWARD_MQA_PARAMS = ("self", "q", "kv", "positions", "output")
_ATTENTION_MODULE_FUNCTIONS = ("get_forward_context", "current_workspace_manager")


def _class_member(cls: type, name: str) -> Any:
    """name as cls's own or inherited class dictionary holds it, or None (no getattr: a class
    may answer every name, as the stand-ins of vLLM's other modules do)."""
    for c in cls.__mro__:
        if name in vars(c):
            return vars(c)[name]
    return None


def _attention_members(replacement: type) -> dict[str, Any]:
    return {n: v for n, v in vars(replacement).items()
            if not (n.startswith("__") and n.endswith("__"))}


def _patch_attention(target: Target, module: Any, owner: type) -> Patch:
    members = _attention_members(target.replacement)
    done = _PATCHED.get(owner)
    if done is not None and vars(owner).get("forward_mqa") is members["forward_mqa"]:
        if done.target.replacement is not target.replacement:
            raise TypeError(f"already patched for {done.target.where()}")
        return done
    missing = [m for m in _ATTENTION_METHODS if not callable(
        getattr(_class_member(owner, m), "__func__", _class_member(owner, m)))]
    if missing:
        raise TypeError(f"{owner.__qualname__} has no {', '.join(missing)} (vLLM 0.33's "
                        f"DeepSeek-V4 FlashMLA layer has)")
    params = tuple(inspect.signature(_class_member(owner, "forward_mqa")).parameters)
    if params != _FORWARD_MQA_PARAMS:
        raise TypeError(f"{owner.__qualname__}.forward_mqa takes ({', '.join(params)}), "
                        f"expected ({', '.join(_FORWARD_MQA_PARAMS)})")
    for name in _ATTENTION_MODULE_FUNCTIONS:
        if not callable(getattr(module, name, None)):
            raise TypeError(f"no {name} in {module.__name__}")
    clash = [n for n in members if n.startswith("_sparse_swa") and _class_member(owner, n)
             is not None]
    if clash:
        raise TypeError(f"{owner.__qualname__} already has {', '.join(clash)}")
    saved = {n: vars(owner)[n] for n in members if n in vars(owner)}
    for name, value in members.items():
        setattr(owner, name, value)
    owner._sparse_swa_vllm_module = module

    def restore() -> None:
        for name in members:
            if name in saved:
                setattr(owner, name, saved[name])
            else:
                delattr(owner, name)
        _PATCHED.pop(owner, None)

    patch = Patch(target, owner, owner, owner, restore)
    _PATCHED[owner] = patch
    return patch


_PATCHERS: dict[str, Callable[[Target, Any, type], Patch]] = {
    "swa_builder": _patch_swa_builder, "attention": _patch_attention}


def install(vllm: Any = None, targets: Sequence[Target] = TARGETS) -> Installation:
    """Makes the running vLLM use the drop-ins: vLLM's DeepSeek-V4 / V4.1 SWA backends (FlashMLA,
    FlashInfer) hand out the drop-in's builders from get_builder_cls(), and vLLM's DeepSeek-V4
    FlashMLA attention layer runs sparse_swa's attention. targets selects: TARGETS (both, the
    default), SWA_BUILDER_TARGETS or ATTENTION_TARGETS. vllm: the vllm package (None imports
    it). Idempotent; returns what it patched and what it left alone. Raises
    UnsupportedVllmError, naming every class it looked for, when a kind of target it was given
    (builders, attention) found nothing to patch; that call then leaves nothing patched. Each
    process that runs the model (every vLLM worker) must call it before its model runner builds
    the model and its builders (sparse_swa.integrations.vllm_plugin does that in every vLLM
    process)."""
    if vllm is None:
        try:
            vllm = importlib.import_module("vllm")
        except ImportError as e:
            raise UnsupportedVllmError(f"install: expected an importable vllm package, got "
                                       f"{e}") from e
    root = vllm if isinstance(vllm, str) else vllm.__name__
    patches, skipped, made = [], {}, []
    for t in targets:
        where = t.where(root)
        name = f"{root}.{t.module}"
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            skipped[where] = f"no module {name}"
            continue
        try:
            module = importlib.import_module(name)
        except Exception as e:  # an optional dependency of that backend is missing
            skipped[where] = f"importing {name} failed: {type(e).__name__}: {e}"
            continue
        owner = getattr(module, t.cls, None)
        if not isinstance(owner, type):
            skipped[where] = f"no class {t.cls} in {name}"
            continue
        before = _PATCHED.get(owner)
        try:
            patch = _PATCHERS[t.kind](t, module, owner)
        except TypeError as e:
            skipped[where] = str(e)
            warnings.warn(f"sparse_swa.integrations.vllm.install: left {where} alone: {e}",
                          stacklevel=2)
            continue
        patches.append(patch)
        if patch is not before:
            made.append(patch)
    unmet = [k for k in dict.fromkeys(t.kind for t in targets)
             if not any(p.target.kind == k for p in patches)]
    if unmet:
        for p in reversed(made):
            p.restore()
        version = getattr(vllm, "__version__", "unknown") if not isinstance(vllm, str) else ""
        parts = []
        for kind in unmet:
            wheres = {t.where(root) for t in targets if t.kind == kind}
            lines = "\n".join(f"  {w}: {why}" for w, why in skipped.items() if w in wheres)
            parts.append(f"install: expected vLLM's {_KIND_NAMES.get(kind, kind)} (vLLM 0.33), "
                         f"found none in {root} {version}:\n{lines}")
        raise UnsupportedVllmError("\n".join(parts))
    return Installation(root, patches, skipped)


def uninstall(installation: Installation | None = None) -> int:
    """Undoes install() (all of it, or one Installation's patches); returns how many."""
    patches = installation.patches if installation else list(_PATCHED.values())
    done = 0
    for p in patches:
        if _PATCHED.get(p.owner) is p:
            p.restore()
            done += 1
    return done
