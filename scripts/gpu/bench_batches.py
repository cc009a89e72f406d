#!/usr/bin/env python3
"""Writes the scenarios of `vllm_swa_builder.py bench` (and of `sparse-swa bench`) as batch files
of the `sparse-swa build` JSON contract, one per scenario, for profiling single builds:
    scripts/gpu/bench_batches.py OUT_DIR
Lengths and page ids are drawn as the reference script draws them (its seed, 7)."""
import json
import random
import sys
from pathlib import Path

SCENARIOS = [(1, 0, 0, "none"), (64, 0, 0, "none"), (256, 0, 0, "none"), (1024, 0, 0, "none"),
             (64, 0, 0, "dspark"), (256, 0, 0, "dspark"), (32, 4, 512, "none"),
             (0, 8, 1024, "none")]


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(7)
    for n_dec, n_pre, pre_len, method in SCENARIOS:
        k = 5 if method == "dspark" else 0
        config = {"window_size": 128, "block_size": 256, "max_num_batched_tokens": 16384,
                  "max_num_seqs": 1024, "max_model_len": 65536, "num_speculative_tokens": k,
                  "speculative_method": method, "parallel_drafting": False,
                  "max_image_tokens": 0, "compress_ratios": [1, 4, 128]}
        qlens = [k + 1 if method == "dspark" else 1] * n_dec + [pre_len] * n_pre
        seq = [rng.randint(200, 8000) + q for q in qlens]
        qsl = [0]
        for q in qlens:
            qsl.append(qsl[-1] + q)
        blocks = max((s + 255) // 256 for s in seq)
        table = [[rng.randint(0, 100000) for _ in range(blocks)] for _ in seq]
        slots = [table[r][p // 256] * 256 + p % 256
                 for r, (s, q) in enumerate(zip(seq, qlens)) for p in range(s - q, s)]
        batch = {"query_start_loc": qsl, "seq_lens": seq, "block_table": table,
                 "slot_mapping": slots, "causal": method != "dspark"}
        name = f"{method}_{n_dec}d_{n_pre}x{pre_len}p.json"
        (out / name).write_text(json.dumps({"config": config, "batch": batch}))


if __name__ == "__main__":
    main()
