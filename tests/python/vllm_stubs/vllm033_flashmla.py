# SPDX-License-Identifier: Apache-2.0
"""vLLM 0.33's DeepSeek-V4 FlashMLA attention layer without vLLM, beside the attention drop-in:
the differential (tests/python/test_vllm_attention_gpu.py, test_vllm_attention.py) and the layer
benchmark (bench/vllm_layer_bench.py) run both on the same step.

vLLM's side is its own code, loaded from the upstream files (scripts/gpu/vllm033_builder.py's
loader, which stands in for the rest of vLLM): DeepseekV4FlashMLAAttention.forward_mqa with its
_forward_decode / _forward_prefill (vllm/models/deepseek_v4/nvidia/flashmla.py), the Triton ops
they call (dequantize_and_gather_k_cache, combine_topk_swa_indices,
compute_global_topk_indices_and_lens: common/ops/cache_utils.py), the SWA metadata builder
(sparse_swa.py) and the FlashMLA metadata builder with its C128A top-k (sparse_mla.py). What
vLLM's files import from modules not loaded is set on the flashmla module per forward
(Step.forward): get_forward_context (the step's metadata), current_workspace_manager and the two
FlashMLA entry points (attention_reference.py: WorkspaceManager, FlashMLAEntryPoints over a
flash_mla module, the sgl-flash-mla wheel on a GPU or TorchFlashMLA elsewhere). The layer
objects are instances of vLLM's class made without its __init__ (which builds weights), with
the attributes its forward reads.

Our side is the same class after install(): its forward_mqa is the drop-in's. vLLM's own
forward_mqa (taken before install) runs the reference layer (heads padded to 64 / 128, the sink
padded with -inf as vLLM's make_attention_sink leaves it), ours the unpadded one, on the same
caches (written by sparse_swa.encode_kv), batch, top-k and metadata builders.

Geometry of DeepSeek-V4: window 128, SWA pages of 64 tokens, attention blocks of 256 tokens
(C4A pages of 64 compressed entries, C128A pages of 2), index_topk 512.
"""

from __future__ import annotations

import bisect
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import random
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path

import torch

import sparse_swa

from .attention_reference import decoded_table, gather_rows, reference_attention

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "scripts" / "gpu"))
import vllm033_builder as v033  # noqa: E402

W, SWA_BLOCK, ATTN_BLOCK, TOPK, HEAD = 128, 64, 256, 512, 512
MAX_MODEL_LEN = 16384
RATIOS = (1, 4, 128)
HEADS = (8, 16, 32, 64, 128)
MODES = ("decode", "mtp", "dspark", "chunked", "mixed", "padded")
FLASHMLA = "vllm.models.deepseek_v4.nvidia.flashmla"
SPARSE_MLA = "vllm.models.deepseek_v4.sparse_mla"
CACHE_UTILS = "vllm.models.deepseek_v4.common.ops.cache_utils"
OPS = "vllm.models.deepseek_v4.common.ops"
EXTRA_REAL = (CACHE_UTILS, SPARSE_MLA)


# ---------------------------------------------------------------- loading vLLM's files
class _OpsLoader(importlib.abc.Loader):
    """vllm.models.deepseek_v4.common.ops: a package whose names come from cache_utils (its
    __init__ is not in the upstream tree)."""

    def create_module(self, spec):
        m = types.ModuleType(spec.name)
        m.__path__ = []

        def __getattr__(name):
            if name.startswith("__"):
                raise AttributeError(name)
            return getattr(importlib.import_module(CACHE_UTILS), name)

        m.__getattr__ = __getattr__
        return m

    def exec_module(self, module):
        pass


class _Finder(v033.VllmFinder):
    """vllm033_builder's finder, plus the upstream files of the attention path."""

    def __init__(self, root):
        super().__init__(root)
        # cache_utils takes its CuTe DSL kernel when has_cutedsl() says so; Triton's here.
        self.attrs["vllm.utils.import_utils"] = {"has_cutedsl": lambda: False}

    def find_spec(self, name, path=None, target=None):
        if name in EXTRA_REAL:
            return importlib.util.spec_from_file_location(
                name, self.root / (name.replace(".", "/") + ".py"))
        if name == OPS:
            return importlib.machinery.ModuleSpec(name, _OpsLoader(), is_package=True)
        return super().find_spec(name, path, target)


def load(root=None):
    """Loads vLLM 0.33's files (vllm033_builder.REAL and the attention path's) as `vllm.*`;
    unload() takes them away. Returns a namespace: modules, backend, flashmla, sparse_mla,
    cache_utils, attention (vLLM's DeepseekV4FlashMLAAttention), vllm_forward_mqa (its own
    forward_mqa, kept before any install())."""
    root = Path(root or v033.upstream_root() or "")
    if not (root / "vllm/v1/attention/backends/mla/sparse_swa.py").exists():
        raise FileNotFoundError(f"no {v033.RELEASE} tree in .shared/upstream or "
                                f"../shared/upstream")
    v033.unload()
    finder = _Finder(root)
    v033._FINDER = finder  # so that vllm033_builder.unload() removes it
    sys.meta_path.insert(0, finder)
    saved = sys.modules.get("transformers")
    sys.modules["transformers"] = v033._module("transformers",
                                               {"DeepseekV4Config": v033.DeepseekV4Config})
    try:
        mods = {n: importlib.import_module(n) for n in v033.REAL + EXTRA_REAL}
    finally:
        if saved is None:
            sys.modules.pop("transformers", None)
        else:
            sys.modules["transformers"] = saved
    # build_c128a_topk_metadata asks the platform for its capability (None: not SM12x).
    mods[SPARSE_MLA].current_platform = types.SimpleNamespace(
        get_device_capability=lambda: None, is_rocm=lambda: False)
    flashmla = mods[FLASHMLA]
    cls = flashmla.DeepseekV4FlashMLAAttention
    return types.SimpleNamespace(
        root=root, modules=mods, backend=mods["vllm.v1.attention.backend"], flashmla=flashmla,
        sparse_mla=mods[SPARSE_MLA], cache_utils=mods[CACHE_UTILS], attention=cls,
        vllm_forward_mqa=vars(cls)["forward_mqa"],
        vllm_padded_heads=vars(cls)["get_padded_num_q_heads"].__func__)


def unload():
    v033.unload()


# ---------------------------------------------------------------- one step, as vLLM makes it
@dataclass
class Case:
    """A random step of a DeepSeek-V4 FlashMLA model: the sparse-swa build config, the SWA
    batch (vllm033_builder's format) and the compressed groups' block tables."""

    mode: str
    config: dict
    batch: dict
    spec: dict  # speculative_method, k, parallel_drafting
    compressed_tables: dict = field(default_factory=dict)  # ratio -> [R, blocks of 256 tokens]
    swa_pool: int = 0  # SWA cache blocks
    compressed_pools: dict = field(default_factory=dict)  # ratio -> blocks of 256 tokens

    def as_v033(self):
        c = dict(self.config)
        return {"config": c, "batch": self.batch, "vllm033": {
            "model": "v4", "builder": "flashmla",
            "hf_config": {"class": "DeepseekV4Config", "compress_ratios": [1, 4, 128],
                          "index_topk": TOPK}}}


def _requests(rng, mode, theta, size):
    """(seq_len, query_len) per request, decodes first; size "small" (the CPU interpreter's),
    "normal" or "big" (a 4096-token prefill chunk, 128-256 decode requests)."""
    decodes, prefills = 0, 0
    if mode in ("decode", "mtp", "dspark", "padded"):
        decodes = {"small": rng.choice([1, 3, 8]), "big": rng.choice([128, 256])}.get(
            size, rng.choice([1, 2, 3, 8, 16, 33, 64]))
    elif mode == "chunked":
        prefills, decodes = rng.randint(1, 3), rng.choice([0, 0, 1, 4])
    else:  # mixed
        decodes, prefills = rng.randint(1, 12), rng.randint(1, 3)
    longest = {"small": 120, "big": 4096}.get(size, rng.choice([200, 700]))
    context = 300 if size == "small" else 3000
    reqs = []
    for _ in range(decodes):
        q = rng.randint(1, theta)
        reqs.append((q + rng.choice([0, rng.randint(0, 200), rng.randint(200, context)]), q))
    if mode == "padded":
        reqs += [(0, 0)] * rng.randint(1, 3)
    for _ in range(prefills):
        q = 4096 if size == "big" else rng.randint(theta + 1, max(theta + 1, longest))
        prefix = 0 if rng.random() < 0.3 else rng.randint(1, context + (1000 if size == "big"
                                                                            else 0))
        reqs.append((prefix + q, q))
        if size == "big":
            break
    return reqs


def spec_of(method="none", k=0):
    return {"speculative_method": method, "num_speculative_tokens": k,
            "parallel_drafting": False}


def make_case(rng, mode, size="normal"):
    """A random step of `mode` (MODES), of `size` (see _requests)."""
    spec = spec_of()
    if mode == "mtp" or (mode == "mixed" and rng.random() < 0.5):
        spec = spec_of("mtp", rng.randint(1, 3))
    if mode == "dspark":
        spec = spec_of("dspark", rng.choice([3, 5, 7]))
    reqs = _requests(rng, mode, 1 + spec["num_speculative_tokens"], size)
    return case_of(rng, mode, reqs, spec, invalid=0.05 if mode == "mixed" else 0.0,
                   padding=rng.randint(0, 5) if mode in ("padded", "mixed") else 0,
                   max_tokens=512 if size == "small" else 8192)


def _tables(rng, reqs, block, width):
    """Block tables [R, width] (vLLM's: as wide as max_model_len, zeros past a request's
    pages) over a pool of random page order; returns (tables, pool blocks)."""
    need = [-(-s // block) for s, _ in reqs]
    pool = sum(need) + rng.randint(1, 8)
    perm = list(range(pool))
    rng.shuffle(perm)
    tables, at = [], 0
    for n in need:
        tables.append(perm[at:at + n] + [0] * (width - n))
        at += n
    return tables, pool


def case_of(rng, mode, reqs, spec, invalid=0.0, padding=0, max_model_len=MAX_MODEL_LEN,
            max_tokens=8192):
    """The case of requests [(seq_len, query_len)] (decodes first): pages of every cache in
    random order, a share `invalid` of the tokens with slot -1, `padding` CUDA-graph padding
    tokens; DSpark steps non-causal. The block tables' width, max_model_len and
    max_num_batched_tokens stay the same from case to case (vLLM's Triton kernels compile per
    block-table width)."""
    assert max(s for s, _ in reqs) <= max_model_len
    qsl = [0]
    for _, q in reqs:
        qsl.append(qsl[-1] + q)
    bt, swa_pool = _tables(rng, reqs, SWA_BLOCK, -(-max_model_len // SWA_BLOCK))
    tables, pools = {}, {}
    for ratio in (4, 128):
        tables[ratio], pools[ratio] = _tables(rng, reqs, ATTN_BLOCK,
                                              -(-max_model_len // ATTN_BLOCK))
    slots = []
    for r, (s, q) in enumerate(reqs):
        for i in range(q):
            pos = s - q + i
            slot = bt[r][pos // SWA_BLOCK] * SWA_BLOCK + pos % SWA_BLOCK
            slots.append(-1 if invalid and rng.random() < invalid else slot)
    slots += [-1] * padding
    assert len(slots) <= max_tokens
    config = {"window_size": W, "block_size": SWA_BLOCK, "max_num_batched_tokens": max_tokens,
              "max_num_seqs": len(reqs) + rng.randint(0, 4), "max_model_len": max_model_len,
              "max_image_tokens": 0, "compress_ratios": [1, 4, 128], **spec}
    batch = {"query_start_loc": qsl, "seq_lens": [s for s, _ in reqs], "block_table": bt,
             "slot_mapping": slots, "causal": spec["speculative_method"] != "dspark"}
    return Case(mode, config, batch, spec, tables, swa_pool, pools)


def positions_of(batch):
    """Each token's position (0 for padding tokens past the last request)."""
    qsl, seq = batch["query_start_loc"], batch["seq_lens"]
    pos = [0] * len(batch["slot_mapping"])
    for r in range(len(seq)):
        q = qsl[r + 1] - qsl[r]
        for i in range(q):
            pos[qsl[r] + i] = seq[r] - q + i
    return pos


class Step:
    """One case on a device: caches, vLLM's and our metadata, the top-k buffer, and the layers
    of each (ratio, heads)."""

    def __init__(self, loaded, case, device, seed=0):
        self.loaded, self.case, self.device = loaded, case, device
        g = torch.Generator(device="cpu").manual_seed(seed)
        keys = torch.Generator(device=device).manual_seed(seed)  # the caches' rows
        c, b = case.config, case.batch
        swa_layout = sparse_swa.page_layout(SWA_BLOCK)
        self.pages = {1: self._cache(case.swa_pool, SWA_BLOCK, swa_layout["page_bytes"], keys)}
        self.blocks = {1: SWA_BLOCK}
        for ratio in (4, 128):
            layout = sparse_swa.compressed_page_layout(ATTN_BLOCK, ratio)
            self.blocks[ratio] = ATTN_BLOCK // ratio
            self.pages[ratio] = self._cache(case.compressed_pools[ratio], self.blocks[ratio],
                                            layout["page_bytes"], keys)
        # vLLM's view of a cache: [num_blocks, block_size, 584], the page stride its stride(0).
        self.kv = {r: torch.as_strided(p, (p.shape[0], self.blocks[r], 584),
                                       (p.stride(0), 584, 1)) for r, p in self.pages.items()}
        kv, vc = v033.vllm_objects(case.as_v033())
        self.vllm_config = vc
        cm = v033.common(loaded, b, device)
        self.swa_vllm = loaded.flashmla.DeepseekSparseSWAFlashMLAMetadataBuilder(
            kv, ["layer.0"], vc, device).build(0, cm)
        ours_cls = loaded.flashmla.DeepseekSparseSWAFlashMLABackend.get_builder_cls()
        self.swa_ours = ours_cls(kv, ["layer.0"], vc, device).build(0, v033.common(
            loaded, b, device))
        pos = positions_of(b)
        self.positions = torch.tensor(pos, dtype=torch.int64, device=device)
        self.comp_md = {}
        for ratio in (4, 128):
            cb = dict(b, block_table=case.compressed_tables[ratio], slot_mapping=[
                -1 if s < 0 else case.compressed_tables[ratio][self._req(t)][p // ATTN_BLOCK]
                * ATTN_BLOCK + p % ATTN_BLOCK for t, (s, p) in enumerate(zip(b["slot_mapping"],
                                                                               pos))])
            spec = v033.MLAAttentionSpec(block_size=ATTN_BLOCK, tokens_per_state=ratio,
                                         num_states=ATTN_BLOCK // ratio, head_size=HEAD)
            self.comp_md[ratio] = loaded.sparse_mla.DeepseekV4FlashMLAMetadataBuilder(
                spec, ["layer.0"], vc, device).build(0, v033.common(loaded, cb, device))
        self.topk = self._topk(pos, c["max_num_batched_tokens"], g)

    def _req(self, t):
        """The request of token t (0 for padding tokens)."""
        qsl = self.case.batch["query_start_loc"]
        r = bisect.bisect_right(qsl, t) - 1
        return r if 0 <= r < len(qsl) - 1 else 0

    def _cache(self, blocks, block_size, page_bytes, g):
        pages = torch.zeros((blocks, page_bytes), dtype=torch.uint8, device=self.device)
        n = blocks * block_size
        for a in range(0, n, 1 << 16):
            k = min(n, a + (1 << 16)) - a
            rows = torch.randn((k, HEAD), generator=g, device=self.device) * 2.0
            slots = torch.arange(a, a + k, dtype=torch.int64, device=self.device)
            if self.device.type == "cuda":
                sparse_swa.encode_kv(pages, block_size, rows, slots)
            else:
                sparse_swa.encode_kv(pages.numpy(), block_size, rows.numpy(), slots.numpy())
        return pages

    def _topk(self, pos, max_tokens, g):
        """The C4A indexer's output [max_num_batched_tokens, 512]: per token min(512,
        (pos + 1) // 4) distinct compressed entries, in random order, then -1."""
        out = torch.full((max_tokens, TOPK), -1, dtype=torch.int32)
        for t, p in enumerate(pos):
            n = (p + 1) // 4
            if n <= 0:
                continue
            pick = torch.randperm(n, generator=g)[:TOPK]
            out[t, :len(pick)] = pick.to(torch.int32)
        return out.to(self.device)

    def layer(self, ratio, heads, ours, sink):
        """A layer of vLLM's class: padded heads and a -inf padded sink for vLLM's own forward,
        the drop-in's head count otherwise."""
        cls = self.loaded.attention
        layer = object.__new__(cls)
        padded = (cls.get_padded_num_q_heads(heads) if ours
                  else self.loaded.vllm_padded_heads(cls, heads))
        prefix = f"model.layers.{RATIOS.index(ratio)}.attn"
        full_sink = torch.full((padded,), float("-inf"), dtype=torch.float32, device=self.device)
        full_sink[:heads] = sink
        layer.__dict__.update(
            prefix=prefix, compress_ratio=ratio, n_local_heads=heads, padded_heads=padded,
            head_dim=HEAD, scale=HEAD ** -0.5, attn_sink=full_sink, window_size=W,
            max_image_tokens=0, max_num_batched_tokens=self.case.config["max_num_batched_tokens"],
            max_model_len=self.case.config["max_model_len"], PREFILL_CHUNK_SIZE=4,
            topk_indices_buffer=self.topk, kv_cache=self.kv[ratio] if ratio > 1 else
            torch.tensor([]),
            swa_cache_layer=types.SimpleNamespace(prefix=f"{prefix}.swa_cache",
                                                  kv_cache=self.kv[1], block_size=SWA_BLOCK))
        return layer

    def context(self, layer, ours):
        """The forward context of a layer: its SWA metadata (ours or vLLM's) and, for a
        compressed layer, vLLM's FlashMLA metadata."""
        md = {layer.swa_cache_layer.prefix: self.swa_ours if ours else self.swa_vllm}
        if layer.compress_ratio > 1:
            md[layer.prefix] = self.comp_md[layer.compress_ratio]
        return types.SimpleNamespace(attn_metadata=md)

    def bind(self, layer, ours, manager, entry_points, metadata=True):
        """Sets what vLLM's flashmla module hands the layer's forward_mqa: the forward context
        (this step's metadata, or None for the warm-up dummy run), the workspace manager and,
        when given, the FlashMLA entry points."""
        fm = self.loaded.flashmla
        ctx = self.context(layer, ours) if metadata else types.SimpleNamespace(
            attn_metadata=None)
        fm.get_forward_context = lambda: ctx
        fm.current_workspace_manager = lambda: manager
        if entry_points is not None:
            fm.flash_mla_with_kvcache = entry_points.flash_mla_with_kvcache
            fm.flash_mla_sparse_fwd = entry_points.flash_mla_sparse_fwd

    def forward(self, layer, q, ours, manager, entry_points):
        """One forward_mqa of layer on q (vLLM's: [T, padded heads, 512], zeros past the
        layer's heads) into a new output buffer; returns the output."""
        self.bind(layer, ours, manager, entry_points)
        out = torch.zeros_like(q)
        if ours:
            layer.forward_mqa(q, None, self.positions, out)
        else:
            self.loaded.vllm_forward_mqa(layer, q, None, self.positions, out)
        return out

    def new_plans(self):
        """Drops the FlashMLA plans made for vLLM's plan holders of this step: the next call of
        each layer type plans anew (as the first layer of its type in a step does)."""
        for t in ("swaonly", "c4a", "c128a"):
            holder = getattr(self.swa_vllm, f"tile_sched_{t}")
            if holder is not None and hasattr(holder, "_flash_mla_meta"):
                del holder._flash_mla_meta

    def warm_up(self, layer, q, manager):
        """The warm-up dummy run of our layer (no metadata); returns its output (ones before)."""
        self.bind(layer, True, manager, None, metadata=False)
        out = torch.ones_like(q)
        layer.forward_mqa(q, None, self.positions, out)
        return out

    def keys_of(self, ratio):
        """Per token (rows, lens) of the SWA segment and, for compressed layers, the global
        top-k and its lens, from the metadata (torch, independent of both paths' kernels):
        decode then prefill tokens."""
        md = self.swa_ours
        td, tp = md.num_decode_tokens, md.num_prefill_tokens
        segs = [(md.decode_swa_indices[:, 0], md.decode_swa_lens)]
        if tp:
            segs.append((md.prefill_swa_indices[:, 0], md.prefill_swa_lens))
        w = max(s[0].shape[1] for s in segs)
        rows = torch.cat([torch.nn.functional.pad(r, (0, w - r.shape[1]), value=-1)
                          for r, _ in segs])
        lens = torch.cat([l for _, l in segs])
        if ratio == 1:
            return rows, lens, None, None
        cm = self.comp_md[ratio]
        bs = ATTN_BLOCK // ratio
        if ratio == 4:
            local = self.topk[:td + tp]
        else:
            local = torch.full((td + tp, cm.c128a_prefill_topk_indices.shape[1]
                                if tp else 1), -1, dtype=torch.int32, device=self.device)
            if tp:
                local[td:] = cm.c128a_prefill_topk_indices
        req = self.swa_vllm.token_to_req_indices[:td + tp].long()
        table = cm.block_table.long()
        ok = local >= 0
        blk = table[req[:, None], (local.clamp(min=0) // bs).long()]
        glob = torch.where(ok, blk * bs + local.clamp(min=0) % bs, -1).to(torch.int32)
        glens = ok.sum(1).to(torch.int32) * self.swa_vllm.is_valid_token[:td + tp]
        if ratio == 128 and td:
            d = cm.c128a_global_decode_topk_indices[:, 0]
            dw = max(d.shape[1], glob.shape[1])
            glob = torch.nn.functional.pad(glob, (0, dw - glob.shape[1]), value=-1)
            glob[:td] = torch.nn.functional.pad(d, (0, dw - d.shape[1]), value=-1)
            glens[:td] = cm.c128a_decode_topk_lens
        return rows, lens, glob, glens

    def reference(self, ratio, q, sink, tokens, chunk=256):
        """fp32 reference (out, mean |v|) of tokens (index tensor) for a layer of this ratio."""
        rows, lens, glob, glens = self.keys_of(ratio)
        tables = getattr(self, "_tables", None)
        if tables is None:
            tables = self._tables = {r: decoded_table(p, self.blocks[r])
                                     for r, p in self.pages.items()}
        outs, means = [], []
        for a in range(0, len(tokens), chunk):
            t = tokens[a:a + chunk]
            keys, valid = gather_rows(tables[1], rows[t], lens[t])
            if glob is not None:
                ek, ev = gather_rows(tables[ratio], glob[t], glens[t])
                keys, valid = torch.cat([keys, ek], 1), torch.cat([valid, ev], 1)
            o, m, _ = reference_attention(q[t], keys, valid, HEAD ** -0.5, sink)
            outs.append(o)
            means.append(m)
        return torch.cat(outs), torch.cat(means)

    def valid_tokens(self):
        """The tokens both paths define: valid tokens of the decode and prefill requests."""
        md = self.swa_vllm
        n = md.num_decode_tokens + md.num_prefill_tokens
        qsl_end = self.case.batch["query_start_loc"][-1]
        valid = md.is_valid_token[:n].clone()
        valid[qsl_end:] = False
        return torch.nonzero(valid).flatten()


def cases(count, seed, size="normal", big_every=0):
    """count random cases cycling through MODES, of `size`; every big_every-th one big."""
    rng = random.Random(seed)
    return [make_case(rng, MODES[i % len(MODES)],
                      "big" if big_every and i % big_every == big_every - 1 else size)
            for i in range(count)]
