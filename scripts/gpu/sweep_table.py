#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Merges the --sweep JSONs of sparse_swa_attention_bench and bench/flashmla_bench.py into one
markdown table (shape, ours median and kernel, FlashMLA median, the ratio), FlashMLA's column
empty where its JSON is absent or lacks the shape.

    scripts/gpu/sweep_table.py OURS.json [FLASHMLA.json]
"""
import json
import os
import sys


def main():
    if len(sys.argv) not in (2, 3):
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    ours = json.load(open(sys.argv[1]))
    theirs = {}
    if len(sys.argv) == 3 and os.path.exists(sys.argv[2]):
        theirs = {r["shape"]: r for r in json.load(open(sys.argv[2]))["results"]}
    cache = ours["results"][0]["cache"] if ours["results"] else "-"
    print(f"ours: {ours['device']}, {ours['runs']} runs, {cache} caches; median µs")
    print("| shape | ours | kernel | FlashMLA | ours / FlashMLA |")
    print("|---|---:|---|---:|---:|")
    for r in ours["results"]:
        t = theirs.get(r["shape"])
        fm = f"{t['median_us']:.1f}" if t else ""
        ratio = f"{r['median_us'] / t['median_us']:.2f}" if t else ""
        print(f"| {r['shape']} | {r['median_us']:.1f} | {r['kernel']} | {fm} | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
