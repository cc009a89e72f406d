#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Host cost of one Python call into sparse_swa: MetadataBuilder.build on a decode batch of 64
(W = 128) and sparse_attention, as the median of N calls of the calling thread's CPU time
(time.thread_time_ns; the wall time too). Run it on two builds (before / after a change) to
compare; results in bench/README.md.

    python bench/python_overhead.py                 # numpy host arrays (CPU backend)
    python bench/python_overhead.py --device cuda   # torch CUDA tensors (kernels run async)

With host arrays the CPU backend does the work inside the call, so the times include it; with
CUDA tensors they are the binding's and the launch's host cost (no sync inside the loop)."""

import argparse
import statistics
import time

import numpy as np

import sparse_swa

BATCH, WINDOW, BLOCK, HEADS = 64, 128, 64, 64


SYNC = None  # --device cuda: torch.cuda.synchronize, run untimed every 32 calls


REPEAT = 1  # --repeat: measurements per call, the smallest median reported


def measure(fn, n):
    """(median thread CPU ns, median wall ns) of n calls, after n // 10 warm-up calls; with
    --repeat R the smallest of R such medians. With CUDA the device is synchronised (untimed)
    every 32 calls, so that a full launch queue never makes a call wait for the GPU."""
    for _ in range(max(n // 10, 1)):
        fn()
    best = None
    for _ in range(REPEAT):
        cpu, wall = [], []
        for i in range(n):
            if SYNC is not None and i % 32 == 0:
                SYNC()
            c0, w0 = time.thread_time_ns(), time.perf_counter_ns()
            fn()
            w1, c1 = time.perf_counter_ns(), time.thread_time_ns()
            cpu.append(c1 - c0)
            wall.append(w1 - w0)
        m = (statistics.median(cpu), statistics.median(wall))
        best = m if best is None or m[0] < best[0] else best
    return best


def add(results, name, fn, n):
    """Measures fn, or records that this build does not support the call (an older build, for
    the before column: no out=, no device attention, no [T, 1, W] indices)."""
    try:
        fn()
    except (TypeError, ValueError, NotImplementedError) as e:
        results.append((f"{name}: unsupported by this build ({type(e).__name__})",
                        (float("nan"), float("nan"))))
        return
    results.append((name, measure(fn, n)))


def decode_batch(rng):
    seq = rng.integers(WINDOW, 4096, BATCH).astype(np.int32)
    qsl = np.arange(BATCH + 1, dtype=np.int32)
    blocks = 4096 // BLOCK
    bt = rng.permutation(BATCH * blocks).astype(np.int32).reshape(BATCH, blocks)
    slots = np.array([bt[r, (s - 1) // BLOCK] * BLOCK + (s - 1) % BLOCK
                      for r, s in enumerate(seq)], np.int64)
    return qsl, seq, bt, slots


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("-n", type=int, default=1000, help="calls per measurement (median)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="measurements per call; the smallest median is reported")
    args = ap.parse_args()
    global REPEAT
    REPEAT = max(args.repeat, 1)
    rng = np.random.default_rng(0)
    config = {"window_size": WINDOW, "block_size": BLOCK, "max_num_batched_tokens": 256,
              "max_num_seqs": BATCH, "max_model_len": 4096}
    qsl, seq, bt, slots = decode_batch(rng)
    layout = sparse_swa.page_layout(BLOCK)
    num_blocks = bt.size if args.device == "cuda" else 2  # every block id of bt on the GPU
    cache = np.zeros((num_blocks, layout["page_bytes"]), np.uint8)
    idx = np.tile(np.arange(WINDOW, dtype=np.int32), (BATCH, 1, 1))  # [64, 1, 128] slots
    lens = np.full(BATCH, WINDOW, np.int32)
    builder = sparse_swa.MetadataBuilder(config)
    results = []

    if args.device == "cpu":
        batch = (qsl, seq, bt, slots)
        add(results, "build (numpy, CPU backend: includes the build)",
            lambda: builder.build(*batch), args.n)
        q1 = np.zeros((1, 1, 512), np.uint16)
        i1, l1 = idx[:1, 0, :1], np.ones(1, np.int32)
        add(results, "sparse_attention T=1 H=1 W=1 (numpy; ~all binding)",
            lambda: sparse_swa.sparse_attention(q1, cache, BLOCK, i1, l1), args.n)
        out1, lse1 = np.zeros((1, 1, 512), np.uint16), np.zeros((1, 1), np.float32)
        add(results, "  same with out= and lse=",
            lambda: sparse_swa.sparse_attention(q1, cache, BLOCK, i1, l1, out=out1, lse=lse1),
            args.n)
        add(results, "to_ragged [64, 128] (numpy)",
            lambda: sparse_swa.to_ragged(idx[:, 0, :], lens), args.n)
        add(results, "build + read 4 metadata arrays (numpy)",
            lambda: (lambda m: (m.decode_swa_indices, m.decode_swa_lens, m.token_to_req_indices,
                                m.is_valid_token))(builder.build(*batch)), args.n)
    else:
        import torch
        global SYNC
        SYNC = torch.cuda.synchronize
        dev = [torch.from_numpy(np.ascontiguousarray(a)).cuda() for a in (qsl, seq, bt, slots)]
        qsl_cpu, seq_cpu = torch.from_numpy(qsl), torch.from_numpy(seq)
        build = lambda: builder.build(*dev, query_start_loc_cpu=qsl_cpu, seq_lens_cpu=seq_cpu)
        add(results, "build (torch CUDA)", build, args.n)

        def build_sync():
            build()
            torch.cuda.current_stream().synchronize()
        add(results, "build + stream sync (torch CUDA)", build_sync, args.n)
        # A fresh metadata object per step, as an engine sees it: every array exported anew.
        add(results, "build + read 4 metadata arrays (torch CUDA)",
            lambda: (lambda m: (m.decode_swa_indices, m.decode_swa_lens, m.token_to_req_indices,
                                m.is_valid_token))(build()), args.n)
        md = build()
        q = torch.zeros((BATCH, HEADS, 512), dtype=torch.bfloat16, device="cuda")
        dcache = torch.from_numpy(cache).cuda()
        didx, dlens = md.decode_swa_indices, md.decode_swa_lens
        out = torch.empty_like(q)
        lse = torch.empty((BATCH, HEADS), device="cuda")
        add(results, "sparse_attention (torch CUDA, out=/lse= given)",
            lambda: sparse_swa.sparse_attention(q, dcache, BLOCK, didx, dlens, out=out, lse=lse),
            args.n)
        add(results, "sparse_attention (torch CUDA, outputs allocated)",
            lambda: sparse_swa.sparse_attention(q, dcache, BLOCK, didx, dlens), args.n)
        torch.cuda.synchronize()

    print(f"sparse_swa {sparse_swa.__version__}, device {args.device}, decode batch {BATCH}, "
          f"W = {WINDOW}, median of {args.n}" + (f", best of {REPEAT}" if REPEAT > 1 else ""))
    print(f"{'call':60s} {'cpu us':>8s} {'wall us':>8s}")
    for name, (cpu, wall) in results:
        print(f"{name:60s} {cpu / 1e3:8.2f} {wall / 1e3:8.2f}")


if __name__ == "__main__":
    main()
