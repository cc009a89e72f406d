# SPDX-License-Identifier: Apache-2.0
"""The attention drop-in against vLLM 0.33's own DeepSeek-V4 FlashMLA layer, run from the
upstream files through tests/python/vllm_stubs/vllm033_flashmla.py (.shared/upstream or
../shared/upstream/vllm-0.33.0): install() puts the drop-in on vLLM's real
DeepseekV4FlashMLAAttention; on every random step both forward_mqa run on the same caches
(written by sparse_swa.encode_kv), batch and C4A top-k: vLLM's own (_forward_decode /
_forward_prefill with heads padded to 64 / 128, its SWA and FlashMLA metadata builders, its
Triton gather / combine / top-k kernels, FlashMLA) and ours (unpadded heads, our builder's
metadata, sparse_attention over the fp8 caches in place, the workspace reserved by the warm-up
dummy run and locked). Every valid token's output must agree within twice the attention
tolerance (vllm_stubs/attention_reference.py compare; docs/design.md#attention-precision); the
fp32 reference over the decoded keys gives the tolerance's scale.

Modes: decode, MTP, DSpark (non-causal), chunked prefill, mixed (MTP or not, invalid tokens,
CUDA-graph padding), padded decode; every step runs the three layer types (SWA-only, C4A, C128A)
at head counts cycling through 8, 16, 32, 64, 128.

- test_drop_in_equals_vllms_flashmla_layer: FlashMLA is the sgl-flash-mla wheel (use_legacy=True,
  as bench/flashmla_bench.py); 240 steps, every 20th big (a 4096-token prefill chunk or 128-256
  decode requests), every 8th with a 1 MiB workspace for our layers (prefills split into calls,
  no room for decoded keys). Every (mode, layer type, head count) is compared, but DSpark at 128
  heads where vLLM's own FlashMLA may refuse its 192-wide rows (reported, not compared). Needs
  a CUDA GPU, sparse_swa's CUDA backend and the wheel.
- test_drop_in_equals_vllms_layer_on_torch_flashmla: FlashMLA emulated in fp32 torch
  (TorchFlashMLA); on a GPU 24 steps, without one 6 small steps on CPU tensors in Triton's
  interpreter, in a fresh interpreter. Also shows that the comparison catches a wrong sink.
- test_decode_captured_in_a_cuda_graph_replays_like_eager: the drop-in's decode captured once,
  replayed on new queries (GPU).

Skipped without torch and triton or without the upstream tree."""

import collections
import importlib.util
import os
import random
import sys

import pytest

import sparse_swa

torch = pytest.importorskip("torch")
ON_GPU = torch.cuda.is_available() and sparse_swa.cuda_available()
if not ON_GPU and "triton" not in sys.modules:
    # Triton reads TRITON_INTERPRET when it is imported; without a GPU its kernels run there.
    os.environ["TRITON_INTERPRET"] = "1"
triton = pytest.importorskip("triton")
RERUN = not ON_GPU and isinstance(triton.language.standard.sum, triton.runtime.JITFunction)

from vllm_stubs import installed_on, run_in_fresh_interpreter  # noqa: E402
from vllm_stubs import vllm033_flashmla as h  # noqa: E402
from vllm_stubs.attention_reference import (  # noqa: E402
    FlashMLAEntryPoints,
    TorchFlashMLA,
    WorkspaceManager,
    compare,
    random_q,
)

if h.v033.upstream_root() is None:
    pytest.skip("no vllm-0.33.0 tree in .shared/upstream or ../shared/upstream",
                allow_module_level=True)
HAS_WHEEL = importlib.util.find_spec("flash_mla") is not None
DEVICE = torch.device("cuda" if ON_GPU else "cpu")


@pytest.fixture(scope="module")
def vllm033():
    """(the loaded upstream modules, the drop-in bound to them) with install() done."""
    if RERUN:
        pytest.skip("runs in a fresh interpreter (test_in_a_fresh_interpreter)")
    with installed_on(h.load, h.unload, ON_GPU) as (loaded, dropin, installation):
        assert [p.target.kind for p in installation.patches][-1] == "attention"
        yield loaded, dropin


@pytest.mark.skipif(not RERUN, reason="Triton runs in this process")
def test_in_a_fresh_interpreter():
    print(run_in_fresh_interpreter(__file__, "-s"))


def test_install_puts_the_drop_in_on_vllms_own_class(vllm033):
    loaded, dropin = vllm033
    cls = loaded.attention
    assert cls.forward_mqa is dropin.SparseSWAFlashMLAAttention.forward_mqa
    assert loaded.vllm_forward_mqa is not cls.forward_mqa
    assert cls.get_padded_num_q_heads(8) == 8 and loaded.vllm_padded_heads(cls, 8) == 64
    assert loaded.vllm_padded_heads(cls, 65) == 128
    assert cls._sparse_swa_vllm_module is loaded.flashmla
    assert cls._forward_decode.__module__ == loaded.flashmla.__name__  # vLLM's, kept


def run_step(loaded, case, index, flash, seed, q_factor=1.0, budget=None):
    """Both layers of each type on one step: {(mode, ratio, heads): compare()'s tuple}.
    q_factor scales our layer's queries (a wrong result, for the comparison's own test); budget
    replaces our layers' workspace budget (bytes: a small one splits prefills into calls and
    leaves no room for decoded keys)."""
    step = h.Step(loaded, case, DEVICE, seed=seed)
    g = torch.Generator().manual_seed(seed)
    tokens = step.valid_tokens()
    total = len(case.batch["slot_mapping"])
    out = {}
    for i, ratio in enumerate(h.RATIOS):
        heads = h.HEADS[(index + i) % len(h.HEADS)]
        sink = torch.randn(heads, generator=g).to(DEVICE)
        ref_layer = step.layer(ratio, heads, False, sink)
        our_layer = step.layer(ratio, heads, True, sink)
        if budget is not None:
            our_layer.__dict__["_sparse_swa_budget_bytes"] = budget
        q = random_q(total, heads, ref_layer.padded_heads, DEVICE, g,
                     scale=random.Random(seed + i).choice([1.0, 3.0]))
        try:
            vllm_out = step.forward(ref_layer, q, False, WorkspaceManager(DEVICE), flash)
        except RuntimeError as e:
            # FlashMLA takes index widths that are multiples of its key tile (128 at 128 heads):
            # DSpark's 192-wide rows at 128 heads may be refused by vLLM's own path.
            if not (case.spec["speculative_method"] == "dspark" and ref_layer.padded_heads == 128):
                raise
            out[(case.mode, ratio, heads)] = ("refused by vLLM's FlashMLA", str(e)[:200])
            continue
        manager = WorkspaceManager(DEVICE)
        ours_q = (q[:, :heads].float() * q_factor).to(torch.bfloat16)
        warm = step.warm_up(our_layer, ours_q, manager)
        assert not warm.any(), "the warm-up dummy run leaves the output zero"
        manager.locked = True  # vLLM locks its workspace after the warm-up
        ours_out = step.forward(our_layer, ours_q, True, manager, flash)
        if len(tokens) == 0:
            continue
        ref, mean = step.reference(ratio, q[:, :heads].float(), sink, tokens)
        out[(case.mode, ratio, heads)] = compare(ours_out[tokens], vllm_out[tokens], ref, mean,
                                                 heads)
    return out


def differential(loaded, count, seed, size, big_every, flash):
    """Runs count random steps (every 8th with a 1 MiB workspace budget); returns
    ({(mode, ratio, heads): [compare tuples]}, rows)."""
    results = collections.defaultdict(list)
    rows = 0
    for i, case in enumerate(h.cases(count, seed, size=size, big_every=big_every)):
        budget = 1 << 20 if i % 8 == 7 else None
        for key, r in run_step(loaded, case, i, flash, seed * 1000 + i, budget=budget).items():
            results[key].append((i, r))
        rows += len(case.batch["slot_mapping"])
    return results, rows


def report(results, rows, what):
    refused = {k: [r for _, r in v if isinstance(r[0], str)] for k, v in results.items()}
    for k, v in refused.items():
        if v:
            print(f"  {k}: {len(v)} calls refused by vLLM's path ({v[0][1]})")
    results = {k: [(i, r) for i, r in v if not isinstance(r[0], str)] for k, v in results.items()}
    results = {k: v for k, v in results.items() if v}
    bad = [(k, i, r) for k, v in results.items() for i, r in v if r[0]]
    worst = max((r[1] for v in results.values() for _, r in v), default=0.0)
    ours = max((r[2] for v in results.values() for _, r in v), default=0.0)
    vllms = max((r[3] for v in results.values() for _, r in v), default=0.0)
    calls = sum(len(v) for v in results.values())
    print(f"\n{what}: {calls} layer calls on steps of {rows} tokens, "
          f"{sum(r[0] for v in results.values() for _, r in v)} rows outside tolerance; largest "
          f"|ours - vLLM| / allowed {worst:.3f}, |ours - fp32| / bound {ours:.3f}, "
          f"|vLLM - fp32| / bound {vllms:.3f}")
    for key in sorted(results):
        v = results[key]
        print(f"  {key[0]:8s} ratio {key[1]:3d} heads {key[2]:3d}: {len(v):3d} calls, "
              f"max {max(r[1] for _, r in v):.3f}, bad rows {sum(r[0] for _, r in v)}")
    return bad


@pytest.mark.skipif(not (ON_GPU and HAS_WHEEL),
                    reason="needs a CUDA GPU, sparse_swa's CUDA backend and the sgl-flash-mla "
                           "wheel (flash_mla)")
def test_drop_in_equals_vllms_flashmla_layer(vllm033):
    import flash_mla

    loaded, _ = vllm033
    results, rows = differential(loaded, 240, 58, "normal", 20, FlashMLAEntryPoints(flash_mla))
    bad = report(results, rows, "vLLM 0.33 FlashMLA layer (sgl-flash-mla) vs the drop-in")
    assert not bad, f"{len(bad)} layer calls with rows outside tolerance: {bad[:10]}"
    compared = {k for k, v in results.items() if any(not isinstance(r[0], str) for _, r in v)}
    everything = {(m, r, hh) for m in h.MODES for r in h.RATIOS for hh in h.HEADS}
    assert everything - compared <= {("dspark", r, 128) for r in h.RATIOS}, everything - compared


def test_drop_in_equals_vllms_layer_on_torch_flashmla(vllm033):
    loaded, _ = vllm033
    count, size = (24, "normal") if ON_GPU else (6, "small")
    flash = FlashMLAEntryPoints(TorchFlashMLA())
    results, rows = differential(loaded, count, 7, size, 0, flash)
    bad = report(results, rows, "vLLM 0.33 FlashMLA layer (FlashMLA in fp32 torch) vs the "
                                "drop-in")
    assert not bad, f"{len(bad)} layer calls with rows outside tolerance: {bad[:10]}"
    assert {m for m, _, _ in results} == set(h.MODES)
    # A wrong result is caught: our layer's queries 3 % larger.
    case = h.cases(1, 3, size="small")[0]
    wrong = run_step(loaded, case, 0, flash, 99, q_factor=1.03)
    assert all(r[0] > 0 for r in wrong.values()), wrong


@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU and sparse_swa's CUDA backend")
def test_decode_captured_in_a_cuda_graph_replays_like_eager(vllm033):
    loaded, _ = vllm033
    rng = random.Random(5)
    done = 0
    for mode in ("decode", "mtp", "dspark"):
        step = h.Step(loaded, h.make_case(rng, mode), DEVICE, seed=3)
        total = len(step.case.batch["slot_mapping"])
        for ratio, heads in ((1, 8), (4, 64), (128, 16), (4, 128)):
            g = torch.Generator().manual_seed(ratio + heads)
            layer = step.layer(ratio, heads, True, torch.randn(heads, generator=g).to(DEVICE))
            manager = WorkspaceManager(DEVICE)
            q = random_q(total, heads, heads, DEVICE, g)
            step.warm_up(layer, q, manager)
            manager.locked = True
            out = torch.zeros_like(q)
            step.bind(layer, True, manager, None)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm-up off the capture
                layer.forward_mqa(q, None, step.positions, out)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                layer.forward_mqa(q, None, step.positions, out)
            for _ in range(2):
                q.copy_(random_q(total, heads, heads, DEVICE, g))
                graph.replay()
                torch.cuda.synchronize()
                eager = step.forward(layer, q, True, manager, None)
                assert torch.equal(out, eager), (mode, ratio, heads)
            done += 1
    assert done == 12
