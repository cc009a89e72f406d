#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The vLLM drop-in (sparse_swa.integrations.vllm) against vLLM's own SWA metadata builder, the
reference run through the stubs of .shared/anchors/vllm_swa_builder.py, on the GPU: both built
from the same vLLM objects and fed the same CommonAttentionMetadata (CUDA tensors).

Per scenario: the host time of build() (the Python call, no sync) and its wall time with a
synchronize, median of --repeat builds, for the reference and for the drop-in; then a step of
--groups KV-cache groups that share the window and block size: the reference builds once per
group, SharedSWAMetadataBuilds once per step. The decode rows and lens of the two are compared
on every scenario. Exit status: 0 equal, 1 a difference, 2 a missing requirement.

    python3 bench/vllm_dropin_bench.py [--anchors .shared/anchors] [--repeat 200] [--groups 4]
"""
import argparse
import random
import statistics
import sys
import time
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# (decode requests, prefill requests, prefill length, speculative method)
SCENARIOS = [(1, 0, 0, "none"), (64, 0, 0, "none"), (256, 0, 0, "none"), (64, 0, 0, "dspark"),
             (32, 4, 512, "none")]


def fail(message):
    print(f"vllm_dropin_bench.py: {message}", file=sys.stderr)
    sys.exit(2)


def load(anchors):
    try:
        import torch
    except ImportError:
        fail("needs PyTorch with a CUDA GPU")
    if not torch.cuda.is_available():
        fail("needs a CUDA GPU, but torch.cuda.is_available() is False")
    import sparse_swa

    if not sparse_swa.cuda_available():
        fail("sparse_swa has no usable CUDA backend")
    if not (anchors / "vllm_swa_builder.py").exists():
        fail(f"no vllm_swa_builder.py in {anchors} (pass --anchors DIR)")
    sys.path.insert(0, str(anchors))
    import vllm_swa_builder as anchor

    seed = anchor.load_seed()  # installs the vllm stubs before the drop-in looks for vLLM
    from sparse_swa.integrations import vllm as dropin

    return torch, anchor, seed, dropin


def scenario(rng, n_dec, n_pre, pre_len, method):
    k = 5 if method == "dspark" else 0
    cfg = {"window_size": 128, "block_size": 256, "max_num_batched_tokens": 16384,
           "max_num_seqs": 1024, "max_model_len": 65536, "num_speculative_tokens": k,
           "speculative_method": method, "parallel_drafting": False, "max_image_tokens": 0,
           "compress_ratios": [1, 4, 128]}
    qlens = [k if method == "dspark" else 1] * n_dec + [pre_len] * n_pre
    seq = [rng.randint(200, 8000) + q for q in qlens]
    qsl = [0]
    for q in qlens:
        qsl.append(qsl[-1] + q)
    blocks = max(-(-s // 256) for s in seq)
    bt = [[rng.randint(0, 100000) for _ in range(blocks)] for _ in seq]
    slots = [bt[r][p // 256] * 256 + p % 256
             for r, (s, q) in enumerate(zip(seq, qlens)) for p in range(s - q, s)]
    batch = {"query_start_loc": qsl, "seq_lens": seq, "block_table": bt, "slot_mapping": slots,
             "causal": method != "dspark"}
    return cfg, batch


def timed(torch, fn, repeat):
    """(median host us of fn() without a sync, median wall us with one)."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    host, wall = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        host.append((t1 - t0) * 1e6)
        wall.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(host), statistics.median(wall)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default = REPO / ".shared" / "anchors"
    if not default.exists():
        default = REPO.parent / "shared" / "anchors"
    parser.add_argument("--anchors", type=Path, default=default)
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--groups", type=int, default=4)
    args = parser.parse_args()
    torch, anchor, seed, dropin = load(args.anchors.resolve())
    device = torch.device("cuda")
    ours_cls = types.SimpleNamespace(  # what the anchor's make_builder instantiates
        DeepseekSparseSWAMetadataBuilder=dropin.SparseSWAMetadataBuilder)
    rng = random.Random(7)
    bad = 0
    print(f"{'scenario':<28} {'ref host':>9} {'ref wall':>9} {'ours host':>10} {'ours wall':>10}"
          f"  {args.groups}-group step: {'ref wall':>9} {'ours wall':>10}  rows")
    for n_dec, n_pre, pre_len, method in SCENARIOS:
        cfg, batch = scenario(rng, n_dec, n_pre, pre_len, method)
        ref_builder = anchor.make_builder(seed, cfg, device)
        ours_builder = anchor.make_builder(ours_cls, cfg, device)
        cm = anchor.to_common(batch, device)
        ref_host, ref_wall = timed(torch, lambda: ref_builder.build(0, cm), args.repeat)
        ours_host, ours_wall = timed(torch, lambda: ours_builder.build(0, cm), args.repeat)

        # KV-cache groups sharing (window, block size): one build per group vs one per step.
        shared = dropin.SharedSWAMetadataBuilds()
        for g in range(args.groups):
            shared.add_group(g, ours_builder.kv_cache_spec, [f"layer.{g}"],
                             ours_builder.vllm_config, device)
        per_group = {g: cm for g in range(args.groups)}
        _, ref_step = timed(torch, lambda: [ref_builder.build(0, cm) for _ in range(args.groups)],
                            args.repeat)
        _, ours_step = timed(torch, lambda: shared.build(0, per_group), args.repeat)

        ref, ours = ref_builder.build(0, cm), shared.build(0, per_group)[0]
        torch.cuda.synchronize()
        same = all(torch.equal(getattr(ref, f).cpu(), getattr(ours, f).cpu())
                   for f in ("decode_swa_indices", "decode_swa_lens", "token_to_req_indices",
                             "is_valid_token"))
        bad += not same
        name = f"{n_dec} dec + {n_pre}x{pre_len} pre, {method}"
        print(f"{name:<28} {ref_host:>9.1f} {ref_wall:>9.1f} {ours_host:>10.1f} {ours_wall:>10.1f}"
              f"  {'':>14}{ref_step:>9.1f} {ours_step:>10.1f}  {'equal' if same else 'DIFFERENT'}",
              flush=True)
    print("times in microseconds; host: the build() call, wall: the call and a synchronize")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
