#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""One decode step of a DeepSeek-V4-Flash attention layer (a C4A layer: SWA + compressed
top-k), end to end on the GPU from Python with PyTorch CUDA tensors:

  build      MetadataBuilder.build: the decode SWA rows [b, 1, 128] and their lens
  encode     encode_kv: the step's new KV row of every request into the fp8_ds_mla SWA cache
  topk       compressed_topk_to_global: a random compressed top-k (the indexer's output, local
             entry numbers) -> global slots of the C4A cache, with their lens
  attention  sparse_attention over the SWA rows plus the compressed top-k as the extra segment,
             with sinks

Prints each part's host time (the Python call, no sync) and device time (CUDA events), median
of --repeat steps, and the step's total (wall time of the four calls and a synchronize), then
checks the result against the CPU reference: the CPU builder's rows equal the GPU's bit for bit,
so do the global top-k slots, and the CPU attention (sparse_swa's CPU backend on host copies of
the same caches) matches the GPU output within the bf16 tolerance. --torch-ops runs the codec and
the attention through torch.ops.sparse_swa.* instead of the plain functions. Exit status: 0
checked, 1 a mismatch, 2 a missing requirement.

    python3 bench/decode_step.py [--batch 64] [--heads 64] [--topk 512] [--repeat 100]
"""
import argparse
import statistics
import sys
import time

WINDOW = 128
SWA_BLOCK = 64  # tokens per SWA page
ATTN_BLOCK = 256  # main-model block; C4A pages hold ATTN_BLOCK / 4 = 64 compressed entries
RATIO = 4
HEAD = 512


def fail(message):
    print(f"decode_step.py: {message}", file=sys.stderr)
    sys.exit(2)


def require_gpu_stack():
    try:
        import numpy as np
        import torch
    except ImportError as e:
        fail(f"needs numpy and PyTorch with a CUDA GPU ({e})")
    if not torch.cuda.is_available():
        fail("needs a CUDA GPU, but torch.cuda.is_available() is False")
    try:
        import sparse_swa
    except ImportError as e:
        fail(f"cannot import sparse_swa ({e}); pip install . from the repository root")
    if not sparse_swa.cuda_available():
        fail("sparse_swa has no usable CUDA backend (built without the CUDA toolkit?)")
    return np, torch, sparse_swa


class Layer:
    """A decode batch of one V4-Flash C4A layer: caches, block tables, the step's inputs."""

    def __init__(self, np, torch, sparse_swa, args):
        g = np.random.default_rng(args.seed)
        b = args.batch
        self.ctx = g.integers(max(RATIO * args.topk, WINDOW), args.max_context, b)  # before step
        seq = self.ctx + 1
        swa_blocks = -(-int(seq.max()) // SWA_BLOCK)
        comp_entries = ATTN_BLOCK // RATIO
        comp_blocks = -(-int(seq.max() // RATIO) // comp_entries)
        swa_pages = g.permutation(b * swa_blocks).reshape(b, swa_blocks).astype(np.int32)
        comp_pages = g.permutation(b * comp_blocks).reshape(b, comp_blocks).astype(np.int32)
        swa_layout = sparse_swa.page_layout(SWA_BLOCK)
        comp_layout = sparse_swa.compressed_page_layout(ATTN_BLOCK, RATIO)
        dev = "cuda"
        self.swa_cache = torch.zeros((b * swa_blocks, swa_layout["page_bytes"]),
                                     dtype=torch.uint8, device=dev)
        self.comp_cache = torch.zeros((b * comp_blocks, comp_layout["page_bytes"]),
                                      dtype=torch.uint8, device=dev)

        def swa_slot(r, pos):
            return swa_pages[r, pos // SWA_BLOCK] * SWA_BLOCK + pos % SWA_BLOCK

        # The context's last W - 1 tokens (all a window reads besides the new token) and every
        # compressed entry, as random rows.
        old = np.array([swa_slot(r, p) for r in range(b)
                        for p in range(self.ctx[r] - WINDOW + 1, self.ctx[r])], dtype=np.int64)
        comp = np.array([comp_pages[r, e // comp_entries] * comp_entries + e % comp_entries
                         for r in range(b) for e in range(seq[r] // RATIO)], dtype=np.int64)
        for cache, block, slots in ((self.swa_cache, SWA_BLOCK, old),
                                    (self.comp_cache, comp_entries, comp)):
            rows = torch.randn((len(slots), HEAD), device=dev)
            sparse_swa.encode_kv(cache, block, rows, torch.from_numpy(slots).to(dev))

        # The step's batch: one new token per request at position ctx.
        self.qsl_cpu = torch.arange(b + 1, dtype=torch.int32)
        self.seq_cpu = torch.from_numpy(seq.astype(np.int32))
        self.qsl, self.seq = self.qsl_cpu.to(dev), self.seq_cpu.to(dev)
        self.block_table = torch.from_numpy(swa_pages).to(dev)
        self.slots = torch.tensor([swa_slot(r, self.ctx[r]) for r in range(b)], dtype=torch.int64,
                                  device=dev)
        self.new_rows = torch.randn((b, HEAD), device=dev).to(torch.bfloat16)
        self.q = torch.randn((b, args.heads, HEAD), device=dev).to(torch.bfloat16)
        self.sinks = torch.randn(args.heads, device=dev)

        # The indexer's top-k: distinct compressed entries of the request (local numbers).
        local = np.full((b, args.topk), -1, dtype=np.int32)
        for r in range(b):
            n = min(args.topk, int(seq[r] // RATIO))
            local[r, :n] = g.choice(int(seq[r] // RATIO), n, replace=False)
        self.local_topk = torch.from_numpy(local).to(dev)
        self.comp_block_table = torch.from_numpy(comp_pages).to(dev)
        self.extra_indices = torch.empty_like(self.local_topk)  # global slots, persistent
        self.extra_lens = torch.empty(b, dtype=torch.int32, device=dev)
        self.comp_entries = comp_entries
        self.out = torch.empty_like(self.q)
        self.lse = torch.empty(self.q.shape[:2], dtype=torch.float32, device=dev)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=64, help="decode requests (1 token each)")
    parser.add_argument("--heads", type=int, default=64)
    parser.add_argument("--topk", type=int, default=512, help="compressed top-k width")
    parser.add_argument("--max-context", type=int, default=8192)
    parser.add_argument("--repeat", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--torch-ops", action="store_true",
                        help="call torch.ops.sparse_swa.* instead of the plain functions")
    args = parser.parse_args()
    np, torch, sparse_swa = require_gpu_stack()
    layer = Layer(np, torch, sparse_swa, args)
    config = {"window_size": WINDOW, "block_size": SWA_BLOCK,
              "max_num_batched_tokens": max(args.batch, 256), "max_num_seqs": args.batch,
              "max_model_len": args.max_context + 1, "compress_ratios": [1, 4, 128]}
    builder = sparse_swa.MetadataBuilder(config, device="cuda")
    L = layer
    if args.torch_ops:
        import sparse_swa.torch_ops  # noqa: F401  registers torch.ops.sparse_swa
        ops = torch.ops.sparse_swa

        def encode():
            ops.encode_kv(L.swa_cache, SWA_BLOCK, L.new_rows, L.slots)

        def attend(md):
            ops.sparse_attention_out(L.q, L.swa_cache, SWA_BLOCK, md.decode_swa_indices,
                                     md.decode_swa_lens, L.out, L.lse, sinks=L.sinks,
                                     extra_cache=L.comp_cache, extra_block_size=L.comp_entries,
                                     extra_indices=L.extra_indices, extra_lens=L.extra_lens)
    else:
        def encode():
            sparse_swa.encode_kv(L.swa_cache, SWA_BLOCK, L.new_rows, L.slots)

        def attend(md):
            sparse_swa.sparse_attention(L.q, L.swa_cache, SWA_BLOCK, md.decode_swa_indices,
                                        md.decode_swa_lens, sinks=L.sinks,
                                        extra_cache=L.comp_cache,
                                        extra_block_size=L.comp_entries,
                                        extra_indices=L.extra_indices, extra_lens=L.extra_lens,
                                        out=L.out, lse=L.lse)

    def build():
        return builder.build(L.qsl, L.seq, L.block_table, L.slots, query_start_loc_cpu=L.qsl_cpu,
                             seq_lens_cpu=L.seq_cpu)

    def topk(md):
        sparse_swa.compressed_topk_to_global(md, 0, L.local_topk, L.comp_block_table,
                                             L.comp_entries, RATIO, out=L.extra_indices,
                                             out_lens=L.extra_lens)

    parts = ["build", "encode", "topk", "attention"]
    host = {p: [] for p in parts}
    device = {p: [] for p in parts}
    total = []
    for i in range(args.repeat + 5):  # the first 5 steps warm up
        events = [torch.cuda.Event(enable_timing=True) for _ in range(len(parts) + 1)]
        torch.cuda.synchronize()
        t = [time.perf_counter()]
        events[0].record()
        md = build()
        t.append(time.perf_counter())
        events[1].record()
        encode()
        t.append(time.perf_counter())
        events[2].record()
        topk(md)
        t.append(time.perf_counter())
        events[3].record()
        attend(md)
        t.append(time.perf_counter())
        events[4].record()
        torch.cuda.synchronize()
        end = time.perf_counter()
        if i < 5:
            continue
        for j, p in enumerate(parts):
            host[p].append((t[j + 1] - t[j]) * 1e6)
            device[p].append(events[j].elapsed_time(events[j + 1]) * 1e3)
        total.append((end - t[0]) * 1e6)

    api = "torch.ops.sparse_swa" if args.torch_ops else "sparse_swa"
    print(f"decode step of a V4-Flash C4A layer via {api}: {args.batch} requests x 1 token, "
          f"{args.heads} heads, SWA window {WINDOW} (block {SWA_BLOCK}), compressed top-k "
          f"{args.topk} (C4A pages of {L.comp_entries}); median of {args.repeat} steps")
    print(f"{'part':<10} {'host us':>9} {'device us':>10}")
    for p in parts:
        print(f"{p:<10} {statistics.median(host[p]):>9.1f} {statistics.median(device[p]):>10.1f}")
    print(f"{'total':<10} {statistics.median(total):>9.1f}   (wall: the four calls + sync)")

    # The check: the CPU builder's rows and the CPU attention on host copies of the caches.
    cpu_md = sparse_swa.MetadataBuilder(config).build(
        L.qsl_cpu.numpy(), L.seq_cpu.numpy(), L.block_table.cpu().numpy(), L.slots.cpu().numpy())
    bad = []
    if not (np.array_equal(md.decode_swa_indices.cpu().numpy(), cpu_md.decode_swa_indices)
            and np.array_equal(md.decode_swa_lens.cpu().numpy(), cpu_md.decode_swa_lens)):
        bad.append("decode rows differ from the CPU builder's")
    cpu_global, cpu_lens = sparse_swa.compressed_topk_to_global(
        cpu_md, 0, L.local_topk.cpu().numpy(), L.comp_block_table.cpu().numpy(), L.comp_entries,
        RATIO)
    if not (np.array_equal(L.extra_indices.cpu().numpy(), cpu_global)
            and np.array_equal(L.extra_lens.cpu().numpy(), cpu_lens)):
        bad.append("global top-k slots differ from the CPU consumer's")
    q_bits = L.q.cpu().view(torch.int16).numpy().view(np.uint16)
    ref_bits, ref_lse = sparse_swa.sparse_attention(
        q_bits, L.swa_cache.cpu().numpy(), SWA_BLOCK, cpu_md.decode_swa_indices[:, 0],
        cpu_md.decode_swa_lens, sinks=L.sinks.cpu().numpy(),
        extra_cache=L.comp_cache.cpu().numpy(), extra_block_size=L.comp_entries,
        extra_indices=cpu_global, extra_lens=cpu_lens)
    ref = torch.from_numpy(np.asarray(ref_bits).view(np.int16)).view(torch.bfloat16).float()
    got = L.out.float().cpu()
    out_err = (got - ref).abs().max().item()
    lse_err = (L.lse.cpu() - torch.from_numpy(np.asarray(ref_lse))).abs().max().item()
    scale = ref.abs().max().item()
    print(f"check vs CPU reference: max |out - ref| {out_err:.3e} (max |ref| {scale:.3e}), "
          f"max |lse - ref| {lse_err:.3e}")
    # bf16 output: a few units in the last place of the largest value; lse in float32.
    if out_err > 2.0**-6 * max(scale, 1e-3):
        bad.append("attention output beyond the bf16 tolerance")
    if lse_err > 1e-3:
        bad.append("lse beyond 1e-3")
    if bad:
        print("MISMATCH: " + "; ".join(bad), file=sys.stderr)
        return 1
    print("result equal to the CPU reference (rows bit for bit, attention within tolerance)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
