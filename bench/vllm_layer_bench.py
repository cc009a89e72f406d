#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""One DeepSeek-V4 attention step as vLLM 0.33 runs it: vLLM's own FlashMLA layer against the
attention drop-in (sparse_swa.integrations.vllm), on the same GPU in the same process.

Both sides are tests/python/vllm_stubs/vllm033_flashmla.py's: vLLM's DeepseekV4FlashMLAAttention
.forward_mqa from the upstream files (heads padded to 64 / 128; decode: C4A top-k mapped by its
Triton kernel, FlashMLA's sparse decode with its plan holder; prefill: the chunk plan, the bf16
gather of both caches and the combined rows by its Triton kernels, flash_mla_sparse_fwd), its
metadata builders, FlashMLA from the sgl-flash-mla wheel (use_legacy=True, as
bench/flashmla_bench.py); ours: the same class after install() (unpadded heads, one
sparse_attention over the fp8 caches). Caches written by sparse_swa.encode_kv, random pages.

Shapes (DeepSeek-V4-Flash geometry, --heads per TP rank: 64 / 32 / 16 / 8 for TP 1 / 2 / 4 / 8):
decode b = 1..256 requests of one token, MTP (b requests of 2 tokens), a 4096-token prefill
chunk after a 4096-token prefix; each for the SWA-only, C4A and C128A layer; contexts 4096-8192,
max_model_len 65536, max_num_batched_tokens 8192.

Device time: the layer's forward_mqa captured in a CUDA graph, the median of --runs replays,
each after a 256 MiB write that flushes the L2 (as bench/flashmla_bench.py). vLLM's decode is
timed as a layer after the first of its type this step (its FlashMLA plan made already); the
"plan" column is the first layer's, whose replay includes FlashMLA's planner. Workspace: the
max_memory_allocated delta of one eager forward with a workspace manager that allocates each
request anew, FlashMLA's kernels left out on vLLM's side (their own buffers are not counted;
ours, the split and decoded-keys scratch, are). Both layers reserve the same workspace in the
warm-up dummy run (the drop-in's budget is vLLM's reservation), printed once per layer type.

    python3 bench/vllm_layer_bench.py [--runs 20] [--heads 64,32,16,8] [--json FILE]
                                      [--filter SUBSTRING]

Needs torch with a CUDA GPU, triton, sparse_swa's CUDA backend, the vLLM 0.33 tree
(.shared/upstream or ../shared/upstream) and the sgl-flash-mla wheel (exits 0 with a note
without the wheel).
"""
import argparse
import json
import os
import random
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fail(message):
    print(f"vllm_layer_bench.py: {message}", file=sys.stderr)
    sys.exit(2)


class NoFlashMLA:
    """FlashMLA's entry points doing nothing: vLLM's side of the workspace measurement."""

    @staticmethod
    def get_mla_metadata(*args, **kwargs):
        return object(), None

    @staticmethod
    def flash_mla_with_kvcache(*args, **kwargs):
        return None, None

    @staticmethod
    def flash_mla_sparse_fwd(*args, **kwargs):
        return None, None, None


def graph_us(torch, call, runs, flush, prepare=None):
    """Median device time (us) of `runs` flushed replays of call() captured in a CUDA graph;
    prepare(), when given, runs before the warm-up call and again just before the capture."""
    if prepare:
        prepare()
    call()
    torch.cuda.synchronize()
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    with torch.cuda.stream(stream):
        call()
        torch.cuda.synchronize()
        if prepare:
            prepare()
        with torch.cuda.graph(graph, stream=stream):
            call()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(runs + 1):
        flush.fill_(1)
        e0.record()
        graph.replay()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) * 1000.0)
    return statistics.median(times[1:])


def peak_mib(torch, call):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    call()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2 ** 20


def shapes(rng, h):
    """(name, requests [(seq_len, query_len)], speculative config) of the benchmark."""
    out = []
    for b in (1, 2, 4, 8, 16, 32, 64, 128, 256):
        out.append((f"decode_b{b}", [(rng.randint(4096, 8192), 1) for _ in range(b)],
                    h.spec_of()))
    for b in (8, 32, 128):
        out.append((f"mtp_b{b}", [(rng.randint(4096, 8192), 2) for _ in range(b)],
                    h.spec_of("mtp", 1)))
    out.append(("prefill_4096", [(8192, 4096)], h.spec_of()))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--heads", default="64,32,16,8")
    ap.add_argument("--json")
    ap.add_argument("--filter", help="the shapes whose name contains it")
    args = ap.parse_args()
    try:
        import torch
        import triton  # noqa: F401
    except ImportError as e:
        fail(f"needs torch and triton ({e})")
    if not torch.cuda.is_available():
        fail("needs a CUDA GPU, but torch.cuda.is_available() is False")
    import sparse_swa

    if not sparse_swa.cuda_available():
        fail("sparse_swa has no usable CUDA backend")
    try:
        import flash_mla
    except ImportError as e:
        print(f"vLLM layer benchmark skipped (no sgl-flash-mla wheel): {e}")
        return 0
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    print(f"vLLM 0.33 DeepSeek-V4 FlashMLA layer vs the sparse_swa drop-in on "
          f"{torch.cuda.get_device_name()}, {args.runs} flushed graph replays per number")
    t0 = time.time()
    rows, reserved = measure(torch, flash_mla, torch.device("cuda"), args,
                             lambda call, prepare=None: graph_us(torch, call, args.runs, flush,
                                                                 prepare),
                             lambda call: peak_mib(torch, call))
    print(f"{len(rows)} measurements in {time.time() - t0:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "runs": args.runs,
                       "reserved_bytes": {str(k): v for k, v in reserved.items()},
                       "rows": rows}, f, indent=1)
    return 0


def measure(torch, flash_mla, dev, args, time_us, workspace_mib):
    """Every shape x layer type x head count: rows of the table, and the warm-up reservation
    per layer type. time_us(call, prepare=None) and workspace_mib(call) measure a call."""
    sys.path.insert(0, os.path.join(REPO, "tests", "python"))
    from vllm_stubs import fresh_dropin
    from vllm_stubs import vllm033_flashmla as h
    from vllm_stubs.attention_reference import FlashMLAEntryPoints, WorkspaceManager, random_q

    if h.v033.upstream_root() is None:
        fail("no vllm-0.33.0 tree in .shared/upstream or ../shared/upstream")
    loaded = h.load()
    dropin = fresh_dropin()
    dropin.install(sys.modules["vllm"])
    heads_list = [int(x) for x in args.heads.split(",")]
    timed = FlashMLAEntryPoints(flash_mla, copy=False)
    empty = FlashMLAEntryPoints(NoFlashMLA(), copy=False)
    rng = random.Random(58)
    rows, reserved = [], {}
    print(f"{'shape':14s} {'layer':6s} {'heads':>5s} {'vLLM us':>9s} {'plan us':>8s} "
          f"{'ours us':>8s} {'vLLM/ours':>9s} {'vLLM MiB':>9s} {'ours MiB':>9s}")
    for name, reqs, spec in shapes(rng, h):
        if args.filter and args.filter not in name:
            continue
        case = h.case_of(rng, name.split("_")[0], reqs, spec, max_model_len=65536,
                         max_tokens=8192)
        step = h.Step(loaded, case, dev, seed=len(rows))
        total = len(case.batch["slot_mapping"])
        for ratio in h.RATIOS:
            kind = {1: "swa", 4: "c4a", 128: "c128a"}[ratio]
            for heads in heads_list:
                g = torch.Generator().manual_seed(ratio * 1000 + heads)
                sink = torch.randn(heads, generator=g).to(dev)
                ref = step.layer(ratio, heads, False, sink)
                ours = step.layer(ratio, heads, True, sink)
                q_ref = random_q(total, heads, ref.padded_heads, dev, g)
                q_ours = q_ref[:, :heads].contiguous()
                out_ref, out_ours = torch.empty_like(q_ref), torch.empty_like(q_ours)
                manager = WorkspaceManager(dev)
                step.warm_up(ours, q_ours, manager)
                manager.locked = True
                reserved[kind] = manager.largest

                def vllm_call():
                    loaded.vllm_forward_mqa(ref, q_ref, None, step.positions, out_ref)

                def ours_call():
                    ours.forward_mqa(q_ours, None, step.positions, out_ours)

                step.bind(ref, False, WorkspaceManager(dev), timed)
                step.new_plans()  # the plans are per head count (FlashMLA checks its shapes)
                vllm_us = time_us(vllm_call)
                plan_us = None
                if step.swa_vllm.num_decode_tokens:  # the first layer of its type: a new plan
                    plan_us = time_us(vllm_call, step.new_plans)
                step.bind(ours, True, manager, None)
                ours_us = time_us(ours_call)
                step.bind(ref, False, WorkspaceManager(dev, fresh=True), empty)
                vllm_mib = workspace_mib(vllm_call)
                step.bind(ours, True, WorkspaceManager(dev, fresh=True), None)
                ours_mib = workspace_mib(ours_call)
                rows.append(dict(shape=name, layer=kind, heads=heads, tokens=total,
                                 vllm_us=vllm_us, vllm_plan_us=plan_us, ours_us=ours_us,
                                 vllm_mib=vllm_mib, ours_mib=ours_mib))
                plan = f"{plan_us:8.1f}" if plan_us is not None else f"{'-':>8s}"
                print(f"{name:14s} {kind:6s} {heads:5d} {vllm_us:9.1f} {plan} {ours_us:8.1f} "
                      f"{vllm_us / ours_us:9.2f} {vllm_mib:9.2f} {ours_mib:9.2f}", flush=True)
    for kind, nbytes in reserved.items():
        print(f"warm-up reservation, {kind} layer: {nbytes / 2 ** 20:.1f} MiB (vLLM's own "
              f"and ours)")
    return rows, reserved


if __name__ == "__main__":
    sys.exit(main())
