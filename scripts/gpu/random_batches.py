#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Writes random, valid batch files (the `sparse-swa build` JSON format) covering every mode:
plain decode, MTP, parallel drafting, DSpark non-causal drafts, chunked prefill, image spans,
invalid tokens inside requests, q = 0 padding requests and trailing CUDA-graph padding.

  random_batches.py --count 600 --seed 1 --out DIR

Configs where our DSpark width departs from the reference's (round_up(W + theta, 64) >
round_up(W + k, 64), where the reference truncates rows) are left out: they are tested as a
departure in the C++ suite, not compared here.

  random_batches.py --vllm033 ...   # also what vLLM 0.33's builder reads (make_case's vllm033)

With --vllm033 each case also carries: batch.replay_start (bounded replay: non-zero in a third
of the cases, only for prefilling requests, 0 <= replay_start[r] <= prefix(r); zeros or absent
in the others), a "vllm033" section (model v4 or v41, builder base / flashmla / flashinfer, the
hf_config's class and ratio fields, model_runner_v2) and "draft_update" (the device seq_lens,
slot_mapping and query_start_loc the engine writes before update_draft_decode_metadata; the
host copies stay the build's). The config section stays the `sparse-swa build` config.
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


def theta(c, model_runner_v2=False):
    """The decode threshold: 1 + k, and k more for parallel drafting on the V1 model runner."""
    k = c["num_speculative_tokens"]
    return 1 + k + (k if c["parallel_drafting"] and not model_runner_v2 else 0)


def departs(c, model_runner_v2=False):
    if c["speculative_method"] != "dspark":
        return False
    w, k = c["window_size"], c["num_speculative_tokens"]
    return round_up(w + theta(c, model_runner_v2), 64) > round_up(w + k, 64)


def make_case(rng, mode, vllm033=False):
    v2 = vllm033 and rng.random() < 0.5
    while True:
        c = make_config(rng, mode)
        if not departs(c, v2):
            break
    th, B, W = theta(c, v2), c["block_size"], c["window_size"]
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
    case = {"config": c, "batch": batch, "chunk_plan_requests": plans}
    if vllm033:
        add_vllm033(rng, mode, case, th, v2)
    return case


# compress ratio -> the layer type name of upstream transformers' DeepseekV4Config
RATE_NAMES = {2: "ratio_two_attention", 4: "compressed_sparse_attention",
              128: "heavily_compressed_attention"}


def hf_config(rng, mode, c, model):
    """The hf_config fields vLLM 0.33 reads for layer types and image widening."""
    if model == "v41":  # compress_ratios alone: 0 sliding, 1 and 2 compressed
        out = {"class": "other"}
        if rng.random() < 0.8:
            out["compress_ratios"] = [rng.choice([0, 1, 2]) for _ in range(rng.randint(1, 6))]
        return out
    # DeepSeek-V4: the image widening needs transformers' DeepseekV4Config.
    out = {"class": "other" if c["max_image_tokens"] and rng.random() < 0.25
           else "DeepseekV4Config"}
    ratios = c["compress_ratios"]
    if rng.random() < 0.5:  # legacy compress_ratios (0 and 1: sliding)
        out["compress_ratios"] = [r if r > 1 else rng.choice([0, 1]) for r in ratios]
    else:  # upstream: compress_rates by layer type, MTP layers appended as sliding
        names = [RATE_NAMES.get(r, "sliding_attention") for r in ratios]
        out["compress_rates"] = {RATE_NAMES[r]: r for r in ratios if r > 1}
        out["layer_types"] = names + [rng.choice(names + ["sliding_attention"])
                                      for _ in range(rng.randint(0, 4))]
        out["num_nextn_predict_layers"] = rng.randint(0, 2)
    return out


def add_vllm033(rng, mode, case, th, model_runner_v2):
    """What vLLM 0.33's builder reads beyond the seed's (see the module's docstring)."""
    c, b = case["config"], case["batch"]
    model = "v41" if rng.random() < (0.3 if mode == "image" else 0.35) else "v4"
    case["vllm033"] = {"model": model, "builder": rng.choice(["base", "flashmla", "flashinfer"]),
                       "hf_config": hf_config(rng, mode, c, model),
                       "model_runner_v2": model_runner_v2}
    qsl, seq, B = b["query_start_loc"], b["seq_lens"], c["block_size"]
    qlens = [qsl[r + 1] - qsl[r] for r in range(len(seq))]
    num_decodes = next((r for r, q in enumerate(qlens) if q > th), len(qlens))
    kind = rng.random()
    with_prefix = [r for r in range(len(seq)) if seq[r] > qlens[r] > 0]
    if kind < 0.36 and with_prefix:  # a third of all cases, with those without a prefix
        # A prefix hit replays its last window, for requests still prefilling: the prefills and
        # some short extends among the decodes (at least one request).
        rs = [0] * len(seq)
        prefilling = [r for r in with_prefix if r >= num_decodes or rng.random() < 0.2]
        for r in prefilling or [rng.choice(with_prefix)]:
            prefix = seq[r] - qlens[r]
            rs[r] = rng.choice([prefix, rng.randint(1, prefix),
                                max(prefix - c["window_size"], 1)])
        b["replay_start"] = rs
    elif kind < 2 / 3:
        b["replay_start"] = [0] * len(seq)
    if any(qlens[:num_decodes]):
        case["draft_update"] = draft_update(rng, b, qlens, num_decodes, B)


def draft_update(rng, b, qlens, num_decodes, B):
    """The next draft step's device inputs: decode requests' seq_lens advanced (within their
    block table), and, in steps without prefills, their query lengths shortened (the freed
    tokens become padding); the decode tokens' slots follow."""
    qsl, seq, bt, slots = b["query_start_loc"], b["seq_lens"], b["block_table"], b["slot_mapping"]
    cols = len(bt[0])
    new_seq, new_q = list(seq), list(qlens)
    decode_only = num_decodes == len(qlens)
    for r in range(num_decodes):
        if qlens[r] == 0:
            continue
        new_seq[r] = min(seq[r] + rng.randint(0, 2), cols * B)
        if decode_only and rng.random() < 0.4:
            new_q[r] = rng.randint(1, qlens[r])
    new_qsl = [0]
    for q in new_q:
        new_qsl.append(new_qsl[-1] + q)
    num_decode_tokens = qsl[num_decodes] if not decode_only else len(slots)
    new_slots = list(slots)
    for t in range(num_decode_tokens):
        new_slots[t] = -1
    for r in range(num_decodes):
        for i in range(new_q[r]):
            p = new_seq[r] - new_q[r] + i
            if rng.random() > 0.06:
                new_slots[new_qsl[r] + i] = bt[r][p // B] * B + p % B
    return {"seq_lens": new_seq, "slot_mapping": new_slots, "query_start_loc": new_qsl}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--count", type=int, default=600)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", required=True)
    ap.add_argument("--vllm033", action="store_true",
                    help="also what vLLM 0.33's builder reads (replay_start, draft_update, ...)")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for i in range(args.count):
        case = make_case(rng, MODES[i % len(MODES)], args.vllm033)
        (out / f"case_{i:04d}.json").write_text(json.dumps(case))


if __name__ == "__main__":
    main()
