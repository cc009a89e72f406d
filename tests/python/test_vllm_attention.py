# SPDX-License-Identifier: Apache-2.0
"""The attention drop-in (sparse_swa.integrations.vllm.attention) without vLLM.

Without torch: install() on the stand-in of vLLM 0.33's class structure (vllm_stubs/fake_vllm.py)
puts the drop-in's methods on DeepseekV4FlashMLAAttention, uninstall() takes them off, and a vLLM
whose FlashMLA layer differs (a missing method, another forward_mqa signature, a missing module
function, no class at all) gets UnsupportedVllmError naming it, with nothing left patched.

With torch (CPU tensors, the CPU reference backend): a layer of the drop-in's class over hand-made
caches and our builder's metadata gives, token for token, the attention over the keys listed here
by hand (SWA window, C4A top-k, C128A top-k), through both top-k mappings (the drop-in builder's
metadata and metadata without it, as vLLM's builder makes); the warm-up dummy run reserves
vLLM's own prefill workspace (a hand-computed byte count) and zeroes the output; no later call
grows the workspace past it; a small workspace splits the prefill into calls with the same
result; bad inputs raise ValueError naming them.
tests/python/test_vllm_attention_033.py runs vLLM 0.33's own layer beside the drop-in."""

import dataclasses
import importlib.util
import warnings
from types import SimpleNamespace as NS

import numpy as np
import pytest

import sparse_swa
from vllm_stubs import fake_vllm, fresh_dropin

FLASHMLA = "models.deepseek_v4.nvidia.flashmla"
V41_FLASHMLA = "models.deepseek_v41.nvidia.flashmla"
ATTENTION = "DeepseekV4FlashMLAAttention"
needs_no_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is not None,
                                   reason="vLLM is installed: the stand-in takes its names")


@pytest.fixture
def vllm(request):
    """(the stand-in's modules as `vllm`, the drop-in bound to them); make()'s arguments as the
    test's indirect parameter."""
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed: the stand-in takes its module names")
    mods = fake_vllm.make("vllm", **getattr(request, "param", {}))
    with fake_vllm.installed(mods):
        dropin = fresh_dropin()
        try:
            yield mods, dropin
        finally:
            dropin.uninstall()
    fresh_dropin()


def layer_class(mods, module=FLASHMLA):
    return getattr(mods[f"vllm.{module}"], ATTENTION)


def test_install_puts_our_attention_on_vllms_flashmla_layer(vllm):
    mods, dropin = vllm
    cls = layer_class(mods)
    vllm_forward = vars(cls)["forward_mqa"]
    assert cls.get_padded_num_q_heads(8) == 64 and cls.get_padded_num_q_heads(65) == 128
    installation = dropin.install()
    [patch] = [p for p in installation.patches if p.target.kind == "attention"]
    assert patch.target == dropin.ATTENTION_TARGETS[0] and patch.owner is cls
    mixin = dropin.SparseSWAFlashMLAAttention
    assert cls.forward_mqa is mixin.forward_mqa and cls._sparse_swa_decode is (
        mixin._sparse_swa_decode)
    assert [cls.get_padded_num_q_heads(h) for h in (1, 8, 16, 32, 64, 128)] == [
        1, 8, 16, 32, 64, 128]  # no padding
    assert cls._sparse_swa_vllm_module is mods[f"vllm.{FLASHMLA}"]
    assert vars(cls)["_forward_decode"] is not None  # vLLM's own, untouched
    # V4.1's FlashMLA layer (another cache record on SM100) is not a target.
    assert layer_class(mods, V41_FLASHMLA).get_padded_num_q_heads(8) == 64
    assert dropin.install().patches == installation.patches  # idempotent
    assert dropin.uninstall(installation) == 5
    assert vars(cls)["forward_mqa"] is vllm_forward and cls.get_padded_num_q_heads(8) == 64
    assert not any(n.startswith("_sparse_swa") for n in vars(cls))
    with pytest.raises(fake_vllm.VllmBuilderRan):
        cls.forward_mqa(object.__new__(cls), None, None, None, None)


def test_targets_select_one_drop_in(vllm):
    mods, dropin = vllm
    cls = layer_class(mods)
    backend = cls.swa_backend_cls
    own_builder = backend.get_builder_cls()
    builders_only = dropin.install(targets=dropin.SWA_BUILDER_TARGETS)
    assert cls.get_padded_num_q_heads(8) == 64 and backend.get_builder_cls() is not own_builder
    dropin.uninstall(builders_only)
    attention_only = dropin.install(targets=dropin.ATTENTION_TARGETS)
    assert cls.get_padded_num_q_heads(8) == 8 and backend.get_builder_cls() is own_builder
    dropin.uninstall(attention_only)
    assert dropin.TARGETS == dropin.SWA_BUILDER_TARGETS + dropin.ATTENTION_TARGETS


def unsupported(dropin, match):
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        with pytest.raises(dropin.UnsupportedVllmError) as e:
            dropin.install()
    message = str(e.value)
    assert "install: expected vLLM's DeepSeek-V4 FlashMLA attention layer (vLLM 0.33), found " \
           "none in vllm" in message, message
    assert f"  vllm.{FLASHMLA}.{ATTENTION}: {match}" in message, message
    return message


@pytest.mark.parametrize("vllm", [dict(missing=(ATTENTION,))], indirect=True)
def test_a_vllm_without_the_layer_gets_a_clear_error_and_no_builders(vllm):
    mods, dropin = vllm
    backend = mods[f"vllm.{FLASHMLA}"].DeepseekSparseSWAFlashMLABackend
    own = backend.get_builder_cls()
    unsupported(dropin, f"no class {ATTENTION} in vllm.{FLASHMLA}")
    assert backend.get_builder_cls() is own  # the builders of that call were taken back


@pytest.mark.parametrize("vllm", [dict(attention={"_forward_prefill": None})], indirect=True)
def test_a_layer_without_vllms_methods_is_refused(vllm):
    _, dropin = vllm
    unsupported(dropin, f"{ATTENTION} has no _forward_prefill (vLLM 0.33's DeepSeek-V4 FlashMLA "
                        "layer has)")


def _forward_mqa_with_extra(self, q, kv, positions, output, extra):
    pass


@pytest.mark.parametrize("vllm", [dict(attention={"forward_mqa": _forward_mqa_with_extra})],
                         indirect=True)
def test_a_layer_with_another_forward_signature_is_refused(vllm):
    mods, dropin = vllm
    unsupported(dropin, f"{ATTENTION}.forward_mqa takes (self, q, kv, positions, output, "
                        "extra), expected (self, q, kv, positions, output)")
    assert layer_class(mods).forward_mqa is _forward_mqa_with_extra


@pytest.mark.parametrize("vllm", [dict(missing=("current_workspace_manager",))], indirect=True)
def test_a_module_without_the_workspace_manager_is_refused(vllm):
    _, dropin = vllm
    unsupported(dropin, f"no current_workspace_manager in vllm.{FLASHMLA}")


@needs_no_vllm
def test_get_padded_num_q_heads_takes_1_to_128():
    attention = fresh_dropin().SparseSWAFlashMLAAttention
    assert attention.get_padded_num_q_heads(24) == 24
    for bad in (0, 129):
        with pytest.raises(ValueError, match=f"num_heads: expected 1..128 heads per rank "
                                             fr"\(sparse_swa.sparse_attention\), got {bad}"):
            attention.get_padded_num_q_heads(bad)


# ------------------------------------------------------------------ the layer on CPU tensors
W, SWA_BLOCK, ATTN_BLOCK, TOPK = 4, 32, 256, 4
SCALE = 512 ** -0.5
# Request 0 decodes position 6; request 1 prefills positions 300..303 (prefix 300).
SEQ, QLEN = [7, 304], [1, 4]
SWA_PAGES = [[9], [4, 0, 7, 1, 8, 2, 5, 3, 6, 10]]  # 32-token pages
C4A_PAGES = [[2], [3, 1]]  # pages of 64 compressed entries
C128A_PAGES = [[1], [0]]  # pages of 2 compressed entries
# The C4A indexer's local top-k per token (min(TOPK, (pos + 1) // 4) entries, then -1).
C4A_LOCAL = [[0, -1, -1, -1], [74, 3, 50, 0], [5, 6, 7, 8], [70, 71, 72, 73], [0, 1, 2, 75]]
POSITIONS = [6, 300, 301, 302, 303]
REQ = [0, 1, 1, 1, 1]


def swa_slot(r, p):
    return SWA_PAGES[r][p // SWA_BLOCK] * SWA_BLOCK + p % SWA_BLOCK


def expected_keys(ratio):
    """Per token, by hand: ([SWA slots], [compressed slots]) it attends to."""
    out = []
    for t, (r, p) in enumerate(zip(REQ, POSITIONS)):
        swa = [swa_slot(r, q) for q in range(max(0, p - W + 1), p + 1)]
        if ratio == 4:
            extra = [C4A_PAGES[r][i // 64] * 64 + i % 64 for i in C4A_LOCAL[t] if i >= 0]
        elif ratio == 128:  # entries 0 .. (pos + 1) // 128 - 1, pages of 2
            extra = [C128A_PAGES[r][i // 2] * 2 + i % 2 for i in range((p + 1) // 128)]
        else:
            extra = []
        out.append((swa, extra))
    return out


def test_hand_listed_keys_read_as_written():
    # Token 0: window 3..6 of request 0, in its page 9; token 4: 300..303 of request 1, in its
    # 10th page (288..319), page 10.
    assert expected_keys(1)[0][0] == [9 * 32 + 3, 9 * 32 + 4, 9 * 32 + 5, 9 * 32 + 6]
    assert expected_keys(1)[4][0] == [10 * 32 + 12, 10 * 32 + 13, 10 * 32 + 14, 10 * 32 + 15]
    assert expected_keys(4)[1][1] == [1 * 64 + 10, 3 * 64 + 3, 3 * 64 + 50, 3 * 64 + 0]
    assert expected_keys(128) == [(expected_keys(1)[t][0], [] if t == 0 else [0, 1])
                                  for t in range(5)]


class _Module:
    """The vLLM module a patched class reads: the forward context and the workspace manager."""

    def __init__(self, metadata, manager):
        self.ctx = NS(attn_metadata=metadata)
        self.manager = manager

    def get_forward_context(self):
        return self.ctx

    def current_workspace_manager(self):
        return self.manager


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


@pytest.fixture(scope="module")
def world(torch):
    """Caches with random keys, our builder's metadata, the compressed layers' metadata."""
    from vllm_stubs.attention_reference import decoded_table

    dropin = fresh_dropin()
    g = torch.Generator().manual_seed(5)

    def cache(blocks, block, page_bytes):
        pages = torch.zeros((blocks, page_bytes), dtype=torch.uint8)
        slots = np.arange(blocks * block, dtype=np.int64)
        sparse_swa.encode_kv(pages.numpy(), block, torch.randn((len(slots), 512),
                                                               generator=g).numpy(), slots)
        return pages

    pages = {1: cache(11, SWA_BLOCK, sparse_swa.page_layout(SWA_BLOCK)["page_bytes"])}
    for ratio, blocks in ((4, 4), (128, 2)):
        layout = sparse_swa.compressed_page_layout(ATTN_BLOCK, ratio)
        pages[ratio] = cache(blocks, ATTN_BLOCK // ratio, layout["page_bytes"])
    blocks = {1: SWA_BLOCK, 4: 64, 128: 2}
    # vLLM's view of the caches: [num_blocks, block_size, 584].
    kv = {r: torch.as_strided(p, (p.shape[0], blocks[r], 584), (p.stride(0), 584, 1))
          for r, p in pages.items()}
    qsl = torch.tensor([0, 1, 5], dtype=torch.int32)
    seq = torch.tensor(SEQ, dtype=torch.int32)
    bt = torch.tensor([SWA_PAGES[0] + [0] * 9, SWA_PAGES[1]], dtype=torch.int32)
    slots = torch.tensor([swa_slot(r, p) for r, p in zip(REQ, POSITIONS)], dtype=torch.int64)
    cfg = {"window_size": W, "block_size": SWA_BLOCK, "max_num_batched_tokens": 16,
           "max_num_seqs": 2, "max_model_len": 1000, "compress_ratios": [1, 4, 128]}
    from test_vllm_dropin import vllm_objects

    spec, vc = vllm_objects(cfg)
    builder = dropin.SparseSWAFlashMLAMetadataBuilder(spec, ["l"], vc, "cpu")
    cm = NS(query_start_loc=qsl, query_start_loc_cpu=qsl, seq_lens=seq,
            seq_lens_cpu_upper_bound=seq, block_table_tensor=bt, slot_mapping=slots,
            causal=True, mm_req_doc_ranges={}, num_reqs=2, num_actual_tokens=5, max_query_len=4)
    swa_md = builder.build(0, cm)
    c128a_local = torch.full((4, 128), -1, dtype=torch.int32)
    c128a_local[:, :2] = torch.tensor([0, 1], dtype=torch.int32)
    comp = {4: NS(block_table=torch.tensor([C4A_PAGES[0] + [0], C4A_PAGES[1]],
                                           dtype=torch.int32), block_size=ATTN_BLOCK),
            128: NS(block_table=torch.tensor(C128A_PAGES, dtype=torch.int32),
                    block_size=ATTN_BLOCK,
                    c128a_global_decode_topk_indices=torch.full((1, 1, 128), -1,
                                                                dtype=torch.int32),
                    c128a_decode_topk_lens=torch.zeros(1, dtype=torch.int32),
                    c128a_prefill_topk_indices=c128a_local)}
    topk = torch.full((16, TOPK), -1, dtype=torch.int32)
    topk[:5] = torch.tensor(C4A_LOCAL, dtype=torch.int32)
    tables = {r: decoded_table(p, blocks[r]) for r, p in pages.items()}
    return NS(dropin=dropin, kv=kv, swa_md=swa_md, comp=comp, topk=topk, tables=tables,
              builder=builder)


def make_layer(torch, world, ratio, heads, metadata=None, manager=None):
    from vllm_stubs.attention_reference import WorkspaceManager

    class Layer(world.dropin.SparseSWAFlashMLAAttention):
        pass

    layer = Layer()
    prefix = f"layers.{ratio}.attn"
    layer.__dict__.update(
        prefix=prefix, compress_ratio=ratio, scale=SCALE, window_size=W, max_image_tokens=0,
        max_num_batched_tokens=16, max_model_len=1000, PREFILL_CHUNK_SIZE=4,
        topk_indices_buffer=world.topk, kv_cache=world.kv.get(ratio, torch.tensor([])),
        attn_sink=torch.linspace(-1.0, 1.0, heads),
        swa_cache_layer=NS(prefix=f"{prefix}.swa_cache", kv_cache=world.kv[1]))
    if metadata is None:
        metadata = {f"{prefix}.swa_cache": world.swa_md}
        if ratio > 1:
            metadata[prefix] = world.comp[ratio]
    manager = manager or WorkspaceManager("cpu")
    Layer._sparse_swa_vllm_module = _Module(metadata, manager)
    return layer, manager


def expected_out(torch, world, ratio, q, sinks):
    from vllm_stubs.attention_reference import reference_attention

    outs = []
    for t, (swa, extra) in enumerate(expected_keys(ratio)):
        keys = torch.cat([world.tables[1][swa], world.tables[ratio][extra] if extra else
                          torch.zeros((0, 512))])
        o, _, _ = reference_attention(q[t:t + 1], keys[None], torch.ones((1, len(keys)),
                                                                         dtype=torch.bool),
                                      SCALE, sinks)
        outs.append(o[0])
    return torch.stack(outs)


@pytest.mark.parametrize("ratio", [1, 4, 128])
@pytest.mark.parametrize("source", [True, False], ids=["ours", "vllms_metadata"])
def test_forward_attends_to_the_hand_listed_keys(torch, world, ratio, source):
    heads = 3
    md = world.swa_md if source else dataclasses.replace(world.swa_md)  # no sparse_swa source
    assert (md.source is None) != source
    meta = {f"layers.{ratio}.attn.swa_cache": md}
    if ratio > 1:
        meta[f"layers.{ratio}.attn"] = world.comp[ratio]
    layer, _ = make_layer(torch, world, ratio, heads, meta)
    g = torch.Generator().manual_seed(ratio)
    q = (torch.randn((5, heads, 512), generator=g) * 2).to(torch.bfloat16)
    out = torch.full_like(q, float("nan"))
    layer.forward_mqa(q, None, None, out)
    want = expected_out(torch, world, ratio, q, layer.attn_sink)
    # The CPU backend in double, rounded to bf16 once.
    torch.testing.assert_close(out.float(), want, rtol=2 ** -8, atol=1e-3)


def test_warm_up_reserves_vllms_prefill_workspace_and_later_calls_fit(torch, world):
    from vllm_stubs.attention_reference import WorkspaceManager

    manager = WorkspaceManager("cpu")
    layer, _ = make_layer(torch, world, 4, 2, metadata=None, manager=manager)
    module = type(layer)._sparse_swa_vllm_module
    module.ctx = NS(attn_metadata=None)
    out = torch.ones((5, 2, 512), dtype=torch.bfloat16)
    layer.forward_mqa(out.clone(), None, None, out)
    assert not out.any()
    # vLLM's dummy run for this layer: 4 requests x (ceil(1000 / 4) + 4 + 16) rows of 512 bf16,
    # 16 x round_up(4 + 4, 128) int32 and 16 int32, each 256-byte aligned.
    assert manager.largest == 4 * (250 + 4 + 16) * 512 * 2 + 16 * 128 * 4 + 256 == 1114368
    manager.locked = True
    module.ctx = NS(attn_metadata={"layers.4.attn.swa_cache": world.swa_md,
                                   "layers.4.attn": world.comp[4]})
    layer.forward_mqa(torch.ones((5, 2, 512), dtype=torch.bfloat16), None, None, out)
    assert manager.largest <= 1114368


def test_a_small_workspace_splits_the_prefill_with_the_same_result(torch, world):
    heads = 2
    layer, manager = make_layer(torch, world, 4, heads)
    q = torch.randn((5, heads, 512), generator=torch.Generator().manual_seed(1)).to(
        torch.bfloat16)
    whole = torch.empty_like(q)
    layer.forward_mqa(q, None, None, whole)
    # Room for one prefill token at a time: lse, top-k and lens of 1 token fill half of it.
    per_token = heads * 4 + TOPK * 4 + 4
    layer.__dict__["_sparse_swa_budget_bytes"] = 2 * per_token + 1
    calls = []
    original = world.dropin.SparseSWAFlashMLAAttention._sparse_swa_call

    def counting(self, q, *args):
        calls.append(q.shape[0])
        return original(self, q, *args)

    type(layer)._sparse_swa_call = counting
    split = torch.empty_like(q)
    layer.forward_mqa(q, None, None, split)
    assert calls == [1, 1, 1, 1, 1]  # four prefill tokens one by one, then the decode token
    assert torch.equal(split, whole)


def test_bad_inputs_name_what_is_wrong(torch, world):
    layer, _ = make_layer(torch, world, 4, 2)
    q = torch.zeros((5, 2, 512), dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"output: expected q's shape \[5, 2, 512\] and dtype "
                                         r"torch.bfloat16, got \[5, 3, 512\] torch.bfloat16"):
        layer.forward_mqa(q, None, None, torch.zeros((5, 3, 512), dtype=torch.bfloat16))
    module = type(layer)._sparse_swa_vllm_module
    module.ctx = NS(attn_metadata={"layers.4.attn": world.comp[4]})
    with pytest.raises(ValueError, match="attn_metadata: expected the SWA metadata under "
                                         "'layers.4.attn.swa_cache', got none"):
        layer.forward_mqa(q, None, None, q.clone())
    module.ctx = NS(attn_metadata={"layers.4.attn.swa_cache": world.swa_md})
    with pytest.raises(ValueError, match="attn_metadata: expected the compressed cache's "
                                         "metadata under 'layers.4.attn', got none"):
        layer.forward_mqa(q, None, None, q.clone())
    layer.compress_ratio = 2
    with pytest.raises(ValueError, match="compress_ratio: expected 1, 4 or 128"):
        layer.forward_mqa(q, None, None, q.clone())
    layer.compress_ratio = 1
    layer.swa_cache_layer.kv_cache = torch.zeros((11, 32, 512), dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="swa_cache_layer.kv_cache: expected vLLM's fp8_ds_mla "
                                         r"cache \(torch.uint8\), got torch.bfloat16"):
        layer.forward_mqa(q, None, None, q.clone())
    layer.swa_cache_layer.kv_cache = torch.zeros((11, 64, 584), dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"swa_cache_layer.kv_cache: expected \[num_blocks, 32, "
                                         r"bytes per token\] \(the metadata's block size\), got "
                                         r"\[11, 64, 584\]"):
        layer.forward_mqa(q, None, None, q.clone())
