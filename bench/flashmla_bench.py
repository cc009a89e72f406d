#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""FlashMLA's sparse decode and prefill on the shapes of sparse_swa_attention_bench, timed alike.

The column beside ours in bench/README.md#attention: the package sgl-flash-mla (SGLang's build of
FlashMLA) with use_legacy=True (its sm90 kernels), caches in the fp8_ds_mla layout both libraries
share, sink on, random slots no two tokens share, the call captured into a CUDA graph (its split
schedule computed once, before capture), 30 replays each after a 256 MiB write that flushes the
L2 (median and min) and 30 warm replays. FlashMLA takes 64 or 128 heads only: smaller head counts
are padded to 64, as engines do. Prefill: flash_mla_sparse_fwd (use_legacy=True) on a bf16
[pool, 1, 512] copy of the keys, every token's keys distinct random rows of the pool. --cache
bf16 times the decode shapes on bf16 keys the same way (FlashMLA's sparse decode reads
fp8_ds_mla caches only, so flash_mla_sparse_fwd is its kernel for bf16 caches): each token's
valid keys (SWA + the extra segment's valid part) distinct rows of a pool of tokens x keys rows,
no two tokens sharing one. Exits 0 with a note when the package is absent.

    python3 bench/flashmla_bench.py [--runs N] [--json FILE] [--only NAME] [--filter SUBSTRING]
                                    [--sweep] [--cache fp8_ds_mla|bf16]
"""
import argparse
import json
import os
import statistics
import sys


def load_shapes(path=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                  "attention_shapes.json")):
    """The shapes of sparse_swa_attention_bench (bench/attention_shapes.json, which it compiles in).

    Returns (decode, prefill, sweep). decode and sweep: (name, tokens, heads, swa width, extra
    width, extra page size, extra fill, tokens per request); prefill (flash_mla_sparse_fwd on a bf16
    copy of the keys, so the bf16 shapes only): (name, query tokens, heads, keys per token, pool of
    keys every token draws its distinct keys from).
    """
    with open(path) as f:
        shapes = json.load(f)
    defaults = shapes["defaults"]  # what an entry leaves out

    def decode(s):
        return (s["name"], s["tokens"], s["heads"], s["swa_width"], s["extra_width"],
                s["extra_page"], s["extra_fill"], s["group"])

    fixed = [{**defaults, **s} for s in shapes["shapes"]]
    prefill = [(s["name"], s["tokens"], s["heads"], s["swa_width"] + s["extra_width"], s["pool"])
               for s in fixed if s["pool"] > 0 and s["cache"] == "bf16"]
    sweep = [decode({**defaults, **family, "name": f"{family['prefix']}{b}", "tokens": b})
             for family in shapes["sweep"] for b in family["batches"]]
    return [decode(s) for s in fixed if s["pool"] == 0], prefill, sweep


SCENARIOS, PREFILL, SWEEP = load_shapes()
TOKEN_BYTES = 584  # 448 e4m3 + 64 bf16 + 8 scale bytes


def make_cache(torch, slots, block_size, gen):
    """Random fp8_ds_mla pages [num_blocks, page_stride] uint8, FlashMLA-padded to 576 bytes."""
    blocks = (slots + block_size - 1) // block_size
    stride = (block_size * TOKEN_BYTES + 575) // 576 * 576
    pages = torch.zeros(blocks, stride, dtype=torch.uint8, device="cuda")
    data = pages[:, : block_size * 576].view(blocks, block_size, 576)
    nope = torch.randint(0, 0x7E, (blocks, block_size, 448), generator=gen, device="cuda")
    sign = torch.randint(0, 2, (blocks, block_size, 448), generator=gen, device="cuda") * 0x80
    data[:, :, :448] = (nope | sign).to(torch.uint8)  # never the NaN codes 0x7f / 0xff
    rope = torch.randn(blocks, block_size, 64, generator=gen, device="cuda").to(torch.bfloat16)
    data[:, :, 448:] = rope.view(torch.uint8)
    scales = pages[:, block_size * 576 : block_size * 584].view(blocks, block_size, 8)
    scales[:, :, :7] = torch.randint(120, 130, (blocks, block_size, 7), generator=gen,
                                     device="cuda").to(torch.uint8)
    view = torch.as_strided(pages, (blocks, block_size, 1, TOKEN_BYTES),
                            (stride, TOKEN_BYTES, TOKEN_BYTES, 1))
    return pages, view, blocks * block_size


def rows(torch, tokens, width, valid, group, pool, gen, share_all_but_one):
    """[tokens, width] int32 slot rows, -1 past `valid`; tokens of a request share keys."""
    perm = torch.randperm(pool, generator=gen, device="cuda").to(torch.int32)
    out = torch.full((tokens, width), -1, dtype=torch.int32, device="cuda")
    nxt = 0
    for t in range(tokens):
        if t % group and share_all_but_one:  # the window moves by one
            out[t, : valid - 1] = out[t - 1, 1:valid]
            out[t, valid - 1] = perm[nxt]
            nxt += 1
        elif t % group:  # the first half of the top-k is shared
            half = valid // 2
            out[t, :half] = out[t - 1, :half]
            out[t, half:valid] = perm[nxt : nxt + valid - half]
            nxt += valid - half
        else:
            out[t, :valid] = perm[nxt : nxt + valid]
            nxt += valid
    return out


def graph_times(torch, call, runs, flush):
    """(median, min) of `runs` flushed graph replays of call() and the median of warm ones."""
    call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        call()
        torch.cuda.synchronize()
        with torch.cuda.graph(graph, stream=stream):
            call()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def timed(flush_first):
        if flush_first:
            flush.fill_(1)
        e0.record()
        graph.replay()
        e1.record()
        e1.synchronize()
        return e0.elapsed_time(e1) * 1000.0

    timed(False)
    cold = [timed(True) for _ in range(runs)]
    warm = [timed(False) for _ in range(runs)]
    return statistics.median(cold), min(cold), statistics.median(warm)


def run_prefill(torch, flash_mla, sc, runs, flush, unique=False):
    """unique: every token's keys rows no other token reads (the decode shapes on bf16)."""
    name, tokens, heads, topk, pool = sc
    gen = torch.Generator(device="cuda")
    gen.manual_seed(4321 + tokens + heads)
    h = max(heads, 64)  # 64 or 128 heads only: engines pad
    kv = torch.randn(pool, 1, 512, generator=gen, device="cuda").to(torch.bfloat16)
    if unique:  # a random permutation of the pool, topk rows a token
        idx = torch.randperm(pool, generator=gen, device="cuda")[:tokens * topk].view(tokens, topk)
    else:  # distinct random keys per token: the first topk of a random permutation of the pool
        idx = torch.rand(tokens, pool, generator=gen, device="cuda").argsort(dim=1)[:, :topk]
    idx = idx.to(torch.int32).view(tokens, 1, topk).contiguous()
    q = torch.randn(tokens, h, 512, generator=gen, device="cuda").to(torch.bfloat16)
    sink = torch.linspace(-1.0, 1.0, h, device="cuda", dtype=torch.float32)

    def call():
        return flash_mla.flash_mla_sparse_fwd(q, kv, idx, 512 ** -0.5, attn_sink=sink,
                                              use_legacy=True)

    med, mn, warm = graph_times(torch, call, runs, flush)
    return dict(shape=name, tokens=tokens, heads=heads, flashmla_heads=h, median_us=med,
                min_us=mn, warm_us=warm)


def run(torch, flash_mla, sc, runs, flush):
    name, tokens, heads, swa_w, extra_w, extra_bs, fill, group = sc
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1234 + tokens * 31 + heads)
    h = max(heads, 64)  # FlashMLA takes 64 or 128 heads
    b, s_q = tokens // group, group
    _, swa_cache, swa_pool = make_cache(torch, tokens * swa_w + 256, 256, gen)
    swa_idx = rows(torch, tokens, swa_w, swa_w, group, swa_pool, gen, True)
    kwargs = {}
    if extra_w:
        valid = int(extra_w * fill)
        _, extra_cache, extra_pool = make_cache(torch, tokens * valid + 256, extra_bs, gen)
        extra_idx = rows(torch, tokens, extra_w, valid, group, extra_pool, gen, False)
        kwargs = dict(extra_k_cache=extra_cache,
                      extra_indices_in_kvcache=extra_idx.view(b, s_q, extra_w),
                      extra_topk_length=torch.full((b,), valid, dtype=torch.int32, device="cuda"))
    q = torch.randn(b, s_q, h, 512, generator=gen, device="cuda").to(torch.bfloat16)
    sink = torch.linspace(-1.0, 1.0, h, device="cuda", dtype=torch.float32)
    meta = flash_mla.get_mla_metadata()[0]

    def call():
        return flash_mla.flash_mla_with_kvcache(
            q, swa_cache, None, None, 512, meta, softmax_scale=512 ** -0.5, is_fp8_kvcache=True,
            indices=swa_idx.view(b, s_q, swa_w), attn_sink=sink,
            topk_length=torch.full((b,), swa_w, dtype=torch.int32, device="cuda"),
            use_legacy=True, **kwargs)

    med, mn, warm = graph_times(torch, call, runs, flush)  # (the first call: split schedule)
    return dict(shape=name, tokens=tokens, heads=heads, flashmla_heads=h, median_us=med,
                min_us=mn, warm_us=warm)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--json")
    ap.add_argument("--only", help="one shape by name")
    ap.add_argument("--filter", help="the shapes whose name contains it")
    ap.add_argument("--sweep", action="store_true",
                    help="the decode batch-size sweep instead of the fixed shapes")
    ap.add_argument("--cache", choices=["fp8_ds_mla", "bf16"], default="fp8_ds_mla",
                    help="the decode shapes' cache dtype (bf16: flash_mla_sparse_fwd)")
    args = ap.parse_args()
    try:
        import torch
        import flash_mla
    except ImportError as e:
        print(f"FlashMLA column skipped: {e}")
        return 0
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    print(f"FlashMLA (sgl-flash-mla, use_legacy=True) on {torch.cuda.get_device_name()}, "
          f"{args.runs} graph replays per shape, decode cache {args.cache}")
    print(f"{'shape':24} {'tokens':>7} {'heads':>6} {'median':>8} {'min':>8} {'warm':>8}")
    results = []
    for sc in SWEEP if args.sweep else SCENARIOS + PREFILL:
        if (args.only and sc[0] != args.only) or (args.filter and args.filter not in sc[0]):
            continue
        try:
            if sc in PREFILL:
                r = run_prefill(torch, flash_mla, sc, args.runs, flush)
            elif args.cache == "bf16":
                name, tokens, heads, swa_w, extra_w, _, fill, _ = sc
                keys = swa_w + int(extra_w * fill)
                r = run_prefill(torch, flash_mla, (name, tokens, heads, keys, tokens * keys),
                                args.runs, flush, unique=True)
            else:
                r = run(torch, flash_mla, sc, args.runs, flush)
        except Exception as e:  # a shape FlashMLA refuses: reported, the others still run
            print(f"{sc[0]:24} failed: {str(e).splitlines()[0][:100]}")
            continue
        results.append(r)
        print(f"{r['shape']:24} {r['tokens']:7d} {r['flashmla_heads']:6d} {r['median_us']:8.1f} "
              f"{r['min_us']:8.1f} {r['warm_us']:8.1f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "runs": args.runs,
                       "decode_cache": args.cache, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
