#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Writes random, valid batch files (the `sparse-swa build` JSON format) covering every mode:
plain decode, MTP, parallel drafting, DSpark non-causal drafts, chunked prefill, image spans,
invalid tokens inside requests, q = 0 padding requests and trailing CUDA-graph padding.

  random_batches.py --count 600 --seed 1 --out DIR

Configs where our DSpark width departs from the reference's (round_up(W + theta, 64) >
round_up(W + k, 64), where the reference truncates rows) are left out: they are tested as a
departure in the C++ suite, not compared here.
"""
import argparse
import json
import random
from pathlib import Path

WINDOWS = [1, 2, 8, 64, 128]
BLOCKS = [4, 32, 256]
MODES = ["plain", "mtp", "parallel", "dspark", "chunked", "image", "padded", "mixed"]


def round_up(x, m):
    return -(-x // m) * m


def make_config(rng, mode):
    c = {"window_size": rng.choice(WINDOWS), "block_size": rng.choice(BLOCKS),
         "max_num_batched_tokens": 0, "max_num_seqs": 0, "max_model_len": 0,
         "num_speculative_tokens": 0, "speculative_method": "none", "parallel_drafting": False,
         "max_image_tokens": 0,
         "compress_ratios": rng.choice([[1], [1, 4], [1, 4, 128], [4, 128], [2, 4], [1, 2, 4, 128]])}
    if mode in ("mtp",) or (mode == "mixed" and rng.random() < 0.3):
        c["speculative_method"], c["num_speculative_tokens"] = "mtp", rng.randint(1, 4)
    if mode == "parallel":
        c["speculative_method"] = rng.choice(["mtp", "dspark"])
        c["num_speculative_tokens"], c["parallel_drafting"] = rng.randint(1, 7), True
    if mode == "dspark" or (mode == "mixed" and rng.random() < 0.3):
        c["speculative_method"], c["num_speculative_tokens"] = "dspark", rng.randint(0, 7)
        c["parallel_drafting"] = rng.random() < 0.5
    if mode == "image" or (mode == "mixed" and rng.random() < 0.3):
        c["max_image_tokens"] = rng.choice([5, 16])
    return c


def theta(c):
    return 1 + (2 if c["parallel_drafting"] else 1) * c["num_speculative_tokens"]


def departs(c):
    if c["speculative_method"] != "dspark":
        return False
    w, k = c["window_size"], c["num_speculative_tokens"]
    return round_up(w + theta(c), 64) > round_up(w + k, 64)


def make_case(rng, mode):
    while True:
        c = make_config(rng, mode)
        if not departs(c):
            break
    th, B, W = theta(c), c["block_size"], c["window_size"]
    noncausal = c["speculative_method"] == "dspark" and (mode == "dspark" or rng.random() < 0.4)
    n_dec = rng.randint(0 if mode in ("chunked", "image") else 1, 8)
    n_pre = 0 if mode in ("padded", "dspark") and rng.random() < 0.7 else rng.randint(0, 4)
    if mode == "padded":
        n_pre = 0
    reqs = []  # (seq_len, query_len)
    for _ in range(n_dec):
        q = rng.randint(1, th)
        if mode in ("parallel", "mtp") and rng.random() < 0.4:
            q = th
        reqs.append((q + rng.randint(0, 300), q))
    if mode == "padded":
        reqs += [(0, 0)] * rng.randint(0, 3)
    for _ in range(n_pre):
        q = rng.randint(th + 1, th + 60)
        prefix = 0 if rng.random() < 0.3 else rng.randint(1, 400)
        reqs.append((prefix + q, q))
    if not reqs:
        reqs.append((5, 1))
    qsl = [0]
    for _, q in reqs:
        qsl.append(qsl[-1] + q)
    cols = max(1, max(-(-s // B) for s, _ in reqs))
    bt = [[rng.randint(0, 5000) for _ in range(cols)] for _ in reqs]
    slots = []
    for r, (s, q) in enumerate(reqs):
        for i in range(q):
            p = s - q + i
            slot = bt[r][p // B] * B + p % B
            slots.append(-1 if rng.random() < 0.06 else slot)
    pad = rng.randint(0, 5) if mode in ("padded", "mixed") else 0
    slots += [-1] * pad
    batch = {"query_start_loc": qsl, "seq_lens": [s for s, _ in reqs], "block_table": bt,
             "slot_mapping": slots, "causal": not noncausal}
    mi = c["max_image_tokens"]
    if mi > 0 and rng.random() < 0.8:
        spans = {}
        for r, (s, q) in enumerate(reqs):
            if s == 0 or rng.random() < 0.4:
                continue
            cur, lst = rng.randint(0, max(0, s - 1)), []
            while cur < s and len(lst) < 3:
                length = rng.randint(1, mi)
                end = min(cur + length - 1, s - 1)
                lst.append([cur, end])
                cur = end + 1 + rng.randint(0, 20)
            if lst:
                spans[str(r)] = lst
        if spans:
            batch["image_spans"] = spans
    # The span buffers hold max_num_batched_tokens spans (the reference asserts it).
    num_spans = sum(len(v) for v in batch.get("image_spans", {}).values())
    c["max_num_batched_tokens"] = max(len(slots), num_spans) + rng.randint(0, 16)
    c["max_num_seqs"] = len(reqs) + rng.randint(0, 4)
    c["max_model_len"] = max(s for s, _ in reqs) + rng.randint(1, 2048)
    plans = [{"compress_ratio": rng.choice([1, 2, 4, 128]), "chunk_size": rng.randint(1, 8)}
             for _ in range(rng.randint(0, 3))]
    return {"config": c, "batch": batch, "chunk_plan_requests": plans}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--count", type=int, default=600)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for i in range(args.count):
        case = make_case(rng, MODES[i % len(MODES)])
        (out / f"case_{i:04d}.json").write_text(json.dumps(case))


if __name__ == "__main__":
    main()
