#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Plays an engine for a few steps on the GPU: sparse_swa's MetadataBuilder next to the
reference builder (vLLM's sparse_swa.py through ../shared/anchors/vllm_swa_builder.py), both fed
the same PyTorch CUDA tensors, their outputs compared field by field and the build times printed.

Steps (DeepSeek-V4, DSpark k speculative tokens, decode threshold theta = 1 + k):
  prefill  chunked prefill of every request (a prefix-cache hit leaves `--chunk` tokens to run)
  verify   causal target step: k + 1 query tokens per request (decodes), CUDA-graph padding, and
           on step 2 a new request's prefill chunk behind them (a mixed batch)
  draft    DSpark non-causal draft block: k query tokens per request (causal=False)
  update   the fused draft loop: one-token causal draft rows, then seq_lens advanced in place and
           update_draft_decode_metadata() on both builders

Needs PyTorch with a CUDA GPU, Triton (for the reference) and sparse_swa built with its CUDA
backend (pip install . on a machine with the CUDA toolkit). Exit status: 0 all outputs equal,
1 a mismatch, 2 a missing requirement.

  python3 examples/engine_step.py [--anchors ../shared/anchors] [--steps 3] [--requests 8]
"""

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def fail(message):
    print(f"engine_step.py: {message}", file=sys.stderr)
    sys.exit(2)


def require_gpu_stack(anchors):
    try:
        import torch
    except ImportError:
        fail("needs PyTorch with a CUDA GPU, but torch is not installed (pip install torch)")
    if not torch.cuda.is_available():
        fail("needs a CUDA GPU, but torch.cuda.is_available() is False")
    try:
        import sparse_swa
    except ImportError as e:
        fail(f"cannot import sparse_swa ({e}); pip install . from the repository root")
    if not sparse_swa.cuda_available():
        fail("sparse_swa has no usable CUDA backend (built without the CUDA toolkit?)")
    if not (anchors / "vllm_swa_builder.py").exists():
        fail(f"no vllm_swa_builder.py in {anchors} (pass --anchors DIR)")
    sys.path.insert(0, str(anchors))
    try:
        import vllm_swa_builder as ref
        seed = ref.load_seed()
    except ImportError as e:
        fail(f"cannot load the reference builder from {anchors}: {e} (it needs triton)")
    return torch, sparse_swa, ref, seed


# ------------------------------------------------------------------------------ the engine


class Engine:
    """Requests with a context length and a page list; batches in the JSON batch format."""

    def __init__(self, cfg, num_requests, rng):
        self.cfg, self.rng = cfg, rng
        self.block = cfg["block_size"]
        self.max_blocks = -(-cfg["max_model_len"] // self.block)
        pages = rng.sample(range(1 << 16), cfg["max_num_seqs"] * self.max_blocks)
        self.pages = [pages[i * self.max_blocks:(i + 1) * self.max_blocks]
                      for i in range(cfg["max_num_seqs"])]
        self.context = [rng.randint(300, 2000) for _ in range(num_requests)]

    def slot(self, r, pos):
        return self.pages[r][pos // self.block] * self.block + pos % self.block

    def batch(self, query_lens, causal=True, padding=0, new_prompt=None):
        """Each running request r runs query_lens[r] tokens after its context; `new_prompt`
        (prompt length, chunk) adds a request whose prefill chunk comes last."""
        reqs = [(r, self.context[r], q) for r, q in enumerate(query_lens)]
        if new_prompt is not None:
            prompt, chunk = new_prompt
            reqs.append((len(self.context), prompt - chunk, chunk))
        qsl, seq, slots = [0], [], []
        for r, ctx, q in reqs:
            qsl.append(qsl[-1] + q)
            seq.append(ctx + q)
            slots += [self.slot(r, ctx + i) for i in range(q)]
        slots += [-1] * padding
        return {"query_start_loc": qsl, "seq_lens": seq, "slot_mapping": slots,
                "block_table": [self.pages[r] for r, _, _ in reqs], "causal": causal}


# ------------------------------------------------------------------------------ comparison

ARRAYS = ["decode_swa_indices", "decode_swa_lens", "prefill_swa_indices", "prefill_swa_lens",
          "prefill_gather_lens", "token_to_req_indices", "is_valid_token",
          "prefill_seq_lens_cpu", "prefill_query_lens_cpu"]
SCALARS = ["num_decodes", "num_prefills", "num_decode_tokens", "num_prefill_tokens",
           "max_decode_query_len", "decode_swa_width"]
LAYER_TYPES = ["swaonly", "c4a", "c128a", "c1a", "c2a"]


def compare(torch, ref_md, ours):
    """Names of the fields where the two builders' outputs differ."""
    bad = [f for f in SCALARS if getattr(ref_md, f) != getattr(ours, f)]
    for f in ARRAYS:
        a, b = getattr(ref_md, f), getattr(ours, f)
        if (a is None) != (b is None):
            bad.append(f)
        elif a is not None and not torch.equal(a.cpu().to(b.dtype), b.cpu()):
            bad.append(f)
    for t in LAYER_TYPES:
        if (getattr(ref_md, f"tile_sched_{t}") is None) != (getattr(ours, f"tile_sched_{t}") is None):
            bad.append(f"tile_sched_{t}")
    if ref_md.num_prefills:
        for ratio in (1, 4, 128):
            if ref_md.get_prefill_chunk_plan(ratio, 4) != ours.get_prefill_chunk_plan(ratio, 4):
                bad.append(f"get_prefill_chunk_plan({ratio}, 4)")
    return bad


def timed(torch, fn, repeat):
    """fn()'s last result and its median wall time in microseconds (synchronised)."""
    times, out = [], None
    for _ in range(repeat):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e6)
    return out, statistics.median(times[1:] if len(times) > 1 else times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--anchors", type=Path, default=REPO.parent / "shared" / "anchors",
                        help="folder holding vllm_swa_builder.py (default ../shared/anchors)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--k", type=int, default=3, help="DSpark speculative tokens")
    parser.add_argument("--chunk", type=int, default=256, help="prefill chunk per request")
    parser.add_argument("--repeat", type=int, default=20, help="timed builds per step")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch, sparse_swa, ref, seed = require_gpu_stack(args.anchors.resolve())

    k = args.k
    cfg = {"window_size": 128, "block_size": 64, "max_num_batched_tokens": 4096,
           "max_num_seqs": max(16, args.requests + 1), "max_model_len": 8192,
           "num_speculative_tokens": k, "speculative_method": "dspark",
           "parallel_drafting": False, "max_image_tokens": 0, "compress_ratios": [1, 4, 128]}
    device = torch.device("cuda")
    engine = Engine(cfg, args.requests, random.Random(args.seed))
    theirs = ref.make_builder(seed, cfg, device)
    ours = sparse_swa.MetadataBuilder(cfg, device="cuda")

    def ours_build(cm):
        return ours.build(cm.query_start_loc, cm.seq_lens, cm.block_table_tensor,
                          cm.slot_mapping, causal=cm.causal,
                          query_start_loc_cpu=cm.query_start_loc_cpu,
                          seq_lens_cpu=cm.seq_lens_cpu_upper_bound)

    failures = 0
    print(f"{'step':>4}  {'kind':<8} {'reqs':>4} {'tokens':>6} {'reference us':>13} "
          f"{'sparse_swa us':>14}  result")

    def report(step, kind, cm, ref_us, ours_us, bad):
        nonlocal failures
        failures += bool(bad)
        result = "equal" if not bad else "DIFFERENT: " + ", ".join(bad)
        print(f"{step:>4}  {kind:<8} {cm.num_reqs:>4} {cm.num_actual_tokens:>6} "
              f"{ref_us:>13.1f} {ours_us:>14.1f}  {result}", flush=True)

    def step_build(step, kind, batch):
        cm = ref.to_common(batch, device)  # both builders read these very tensors
        ref_md, ref_us = timed(torch, lambda: theirs.build(0, cm), args.repeat)
        md, ours_us = timed(torch, lambda: ours_build(cm), args.repeat)
        report(step, kind, cm, ref_us, ours_us, compare(torch, ref_md, md))
        return cm, ref_md, md

    n = args.requests
    step_build(0, "prefill", engine.batch([args.chunk] * n))
    for step in range(1, args.steps + 1):
        new = (600, 300) if step == 2 and n + 1 <= cfg["max_num_seqs"] else None
        step_build(step, "verify", engine.batch([k + 1] * n, padding=3, new_prompt=new))
        if new is not None:
            engine.context.append(new[0])
            n += 1
        for r in range(n):  # accept 1..k+1 tokens per request
            engine.context[r] += engine.rng.randint(1, k + 1)
        step_build(step, "draft", engine.batch([k] * n, causal=False))

        # The fused draft loop: one-token causal draft rows advanced in place between tokens.
        cm, ref_md, md = step_build(step, "draft1", engine.batch([1] * n))
        for _ in range(2):
            cm.seq_lens.add_(1)
            cm.seq_lens_cpu_upper_bound.add_(1)  # our CUDA backend checks with the host copy
            _, ref_us = timed(torch, lambda: theirs.update_draft_decode_metadata(ref_md),
                              args.repeat)
            _, ours_us = timed(torch, lambda: ours.update_draft_decode_metadata(md), args.repeat)
            report(step, "update", cm, ref_us, ours_us, compare(torch, ref_md, md))

    if failures:
        print(f"{failures} step(s) differ from the reference", file=sys.stderr)
        return 1
    print("all steps equal to the reference")
    return 0


if __name__ == "__main__":
    sys.exit(main())
