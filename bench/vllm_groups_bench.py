#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""DeepSeek-V4.1's three KV-cache groups of one decode step, on the GPU: vLLM 0.33's own
V4.1 FlashMLA SWA builder (its files loaded through scripts/gpu/vllm033_builder.py) building the
three groups one after another, the drop-in's SharedSWAMetadataBuilds on the same groups (one
build_groups launch) and sparse_swa.MetadataBuilder.build_groups called directly.

The step: W = 128, 32-token pages, each group with its own block table and slots (the groups
share query_start_loc and seq_lens, as vLLM's do), decode requests of one token with seq_lens
uniform in [200, 8000]; decode batches 1, 64 and 256. Per way: the median host time of the call
(no sync) and its median wall time (the call and torch.cuda.synchronize()) over --repeat calls
after a warm-up. Every group's decode rows, lens, token_to_req_indices and is_valid_token of
both of ours must equal vLLM's (the drop-in's other fields too). Exit status: 0 equal, 1 a difference, 2 a missing requirement.

    python3 bench/vllm_groups_bench.py [--repeat 300] [--json FILE] [--upstream DIR]
"""
import argparse
import dataclasses
import json
import random
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from vllm_dropin_bench import timed  # noqa: E402  (median host and wall µs of a call)

BATCHES = (1, 64, 256)
GROUPS = 3
WINDOW, BLOCK = 128, 32
COMPARED = ("decode_swa_indices", "decode_swa_lens", "token_to_req_indices", "is_valid_token")
# DeepSeek-V4.1 (a config of no transformers class; ratios 0 SWA-only, 1 c1a, 2 c2a).
CASE = {"config": {"window_size": WINDOW, "block_size": BLOCK, "max_num_batched_tokens": 16384,
                   "max_num_seqs": 1024, "max_model_len": 65536, "num_speculative_tokens": 0,
                   "speculative_method": "none", "parallel_drafting": False,
                   "max_image_tokens": 0, "compress_ratios": [1]},
        "vllm033": {"model": "v41", "builder": "flashmla",
                    "hf_config": {"class": "other", "compress_ratios": [0, 1, 2]}}}


def fail(message):
    print(f"vllm_groups_bench.py: {message}", file=sys.stderr)
    sys.exit(2)


def load(upstream):
    """(torch, sparse_swa, vllm033_builder, its loaded vLLM 0.33 modules, the drop-in)."""
    try:
        import torch
    except ImportError:
        fail("needs PyTorch with a CUDA GPU")
    if not torch.cuda.is_available():
        fail("needs a CUDA GPU, but torch.cuda.is_available() is False")
    try:
        import triton  # noqa: F401  (vLLM's builder kernels)
    except ImportError:
        fail("needs Triton (vLLM 0.33's builder kernels)")
    import sparse_swa

    if not sparse_swa.cuda_available():
        fail("sparse_swa has no usable CUDA backend")
    if not hasattr(sparse_swa.MetadataBuilder, "build_groups"):
        fail("this sparse_swa has no MetadataBuilder.build_groups")
    sys.path.insert(0, str(REPO / "scripts" / "gpu"))
    import vllm033_builder as v033

    root = v033.upstream_root(upstream)
    if root is None:
        fail("no vllm-0.33.0 tree in .shared/upstream or ../shared/upstream (pass --upstream DIR)")
    loaded = v033.load(root)
    # Imported after vLLM's modules: the drop-in's builders derive from vLLM's, as in an engine.
    from sparse_swa.integrations import vllm as dropin

    return torch, sparse_swa, v033, loaded, dropin


def step(torch, v033, loaded, rng, n, device):
    """Each group's CommonAttentionMetadata: one query_start_loc and seq_lens, its own block
    table and slots."""
    seq = [rng.randint(200, 8000) for _ in range(n)]
    blocks = -(-max(seq) // BLOCK)
    cms = []
    for _ in range(GROUPS):
        bt = [rng.sample(range(100000), blocks) for _ in seq]
        slots = [bt[r][(s - 1) // BLOCK] * BLOCK + (s - 1) % BLOCK for r, s in enumerate(seq)]
        batch = {"query_start_loc": list(range(n + 1)), "seq_lens": seq, "block_table": bt,
                 "slot_mapping": slots, "causal": True}
        cm = v033.common(loaded, batch, device)
        if cms:  # the step's arrays are the first group's
            cm = dataclasses.replace(
                cm, query_start_loc=cms[0].query_start_loc, seq_lens=cms[0].seq_lens,
                query_start_loc_cpu=cms[0].query_start_loc_cpu,
                seq_lens_cpu_upper_bound=cms[0].seq_lens_cpu_upper_bound,
                positions=cms[0].positions)
        cms.append(cm)
    return cms


def same(torch, ref, ours):
    return all(torch.equal(getattr(r, f).cpu(), getattr(o, f).cpu())
               for r, o in zip(ref, ours) for f in COMPARED)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=300)
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--upstream", help="the vllm-0.33.0 tree (default: .shared/upstream or "
                                           "../shared/upstream)")
    args = parser.parse_args()
    torch, sparse_swa, v033, loaded, dropin = load(args.upstream)
    device = torch.device("cuda")
    kv, vc = v033.vllm_objects(CASE)
    vllm_cls = v033.vllm_builder_cls(loaded, CASE)
    ours_cls = dropin.SparseSWAV41FlashMLAMetadataBuilder
    config = dropin.builder_config(kv, vc)
    rng = random.Random(41)
    rows, bad = [], 0
    print(f"{'decode batch':>12}  {'vLLM 0.33, 3 x build()':>22}  {'drop-in, shared':>18}  "
          f"{'build_groups':>16}  rows")
    for n in BATCHES:
        cms = step(torch, v033, loaded, rng, n, device)
        vllm_builders = [vllm_cls(kv, [f"layer.{g}"], vc, device) for g in range(GROUPS)]
        shared = dropin.SharedSWAMetadataBuilds()
        for g in range(GROUPS):
            shared.add_group(g, kv, [f"layer.{g}"], vc, device, builder_cls=ours_cls,
                             own_batch=True)
        per_group = dict(enumerate(cms))
        with torch.cuda.device(device):
            direct = [sparse_swa.MetadataBuilder(config, device="cuda") for _ in range(GROUPS)]
        cm0 = cms[0]
        tables = [cm.block_table_tensor for cm in cms]
        slots = [cm.slot_mapping for cm in cms]

        def build_vllm():
            return [b.build(0, cm) for b, cm in zip(vllm_builders, cms)]

        def build_shared():
            return shared.build(0, per_group)

        def build_direct():
            return sparse_swa.MetadataBuilder.build_groups(
                direct, cm0.query_start_loc, cm0.seq_lens, tables, slots,
                query_start_loc_cpu=cm0.query_start_loc_cpu,
                seq_lens_cpu=cm0.seq_lens_cpu_upper_bound)

        times = {name: timed(torch, fn, args.repeat) for name, fn in (
            ("vllm", build_vllm), ("dropin", build_shared), ("build_groups", build_direct))}
        ref, ours, plain = build_vllm(), build_shared(), build_direct()
        torch.cuda.synchronize()
        fields = [f"group {g}: {f}" for g in range(GROUPS)
                  for f in v033.differences(ref[g], ours[g])]  # the drop-in: every field
        equal = (same(torch, ref, [ours[g] for g in range(GROUPS)]) and same(torch, ref, plain)
                 and not fields)
        bad += not equal
        rows.append({"decode_batch": n, "equal": equal, **{
            k: {"host_us": round(h, 2), "wall_us": round(w, 2)} for k, (h, w) in times.items()}})
        cells = [f"{times[k][0]:>7.1f} / {times[k][1]:>7.1f}" for k in times]
        print(f"{n:>12}  {cells[0]:>22}  {cells[1]:>18}  {cells[2]:>16}  "
              f"{'equal' if equal else 'DIFFERENT'}", flush=True)
        if fields:
            print(f"  the drop-in's fields that differ from vLLM's: {', '.join(fields)}")
    print(f"host / wall us, medians of {args.repeat}; host: the call returning, wall: the call "
          f"and a synchronize; {GROUPS} groups, W = {WINDOW}, {BLOCK}-token pages")
    if args.json:
        args.json.write_text(json.dumps({
            "device": torch.cuda.get_device_name(device), "repeat": args.repeat,
            "groups": GROUPS, "window": WINDOW, "block_size": BLOCK, "rows": rows}, indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
