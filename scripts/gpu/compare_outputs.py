#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Compares two files of JSON lines (the reference script's `run` output and ours, one object
per batch, same order) field by field; prints the first differences and a summary line.

  compare_outputs.py REFERENCE.jsonl OURS.jsonl [BATCH_FILES...]
"""
import json
import sys


def main():
    ref = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
    ours = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
    names = sys.argv[3:]
    if len(ref) != len(ours):
        print(f"count mismatch: reference {len(ref)} lines, ours {len(ours)}")
        return 1
    bad = 0
    for i, (a, b) in enumerate(zip(ref, ours)):
        diffs = [k for k in a if a.get(k) != b.get(k)] + [k for k in b if k not in a]
        if diffs:
            bad += 1
            if bad <= 5:
                name = names[i] if i < len(names) else str(i)
                print(f"{name}: fields differ: {diffs}")
                for k in diffs[:2]:
                    print(f"  {k}: reference {str(a.get(k))[:300]}")
                    print(f"  {k}: ours      {str(b.get(k))[:300]}")
    print(f"{len(ref) - bad} passed, {bad} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
