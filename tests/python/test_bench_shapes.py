# SPDX-License-Identifier: Apache-2.0
"""bench/flashmla_bench.py times FlashMLA on the attention benchmark's shapes, which both read from
bench/attention_shapes.json: its lists must be that file's, each field where the C++ benchmark
takes it (defaults included)."""

import importlib.util
import json
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def load_bench():
    spec = importlib.util.spec_from_file_location("flashmla_bench", BENCH / "flashmla_bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # torch and flash_mla are imported by main() only
    return module


def test_decode_shapes_are_the_files_with_its_defaults():
    shapes = json.loads((BENCH / "attention_shapes.json").read_text())["shapes"]
    decode = [s for s in shapes if "pool" not in s]
    bench = load_bench()
    assert [sc[0] for sc in bench.SCENARIOS] == [s["name"] for s in decode]
    by_name = {sc[0]: sc for sc in bench.SCENARIOS}
    swa_only = by_name["swa_only_h64_b64"]
    assert swa_only[4] == 0 and swa_only[5] == 0  # no extra segment
    c128a = by_name["c128a_h64_b64"]
    assert c128a[3:] == (128, 1024, 2, 0.5, 1)
    mtp = by_name["mtp2_h64_64req"]
    assert mtp[1:] == (128, 64, 128, 512, 64, 1.0, 2)


def test_prefill_shapes_are_the_bf16_ones_with_their_keys_per_token():
    shapes = json.loads((BENCH / "attention_shapes.json").read_text())["shapes"]
    bf16 = [s for s in shapes if "pool" in s and s["cache"] == "bf16"]
    fp8 = [s for s in shapes if "pool" in s and s["cache"] == "fp8_ds_mla"]
    assert bf16 and fp8  # FlashMLA's sparse prefill reads bf16 keys: the fp8 shapes are ours only
    bench = load_bench()
    assert bench.PREFILL == [(s["name"], s["tokens"], s["heads"],
                              s["swa_width"] + s["extra_width"], s["pool"]) for s in bf16]


def test_sweep_names_a_shape_per_batch_of_each_family():
    families = json.loads((BENCH / "attention_shapes.json").read_text())["sweep"]
    bench = load_bench()
    assert len(bench.SWEEP) == sum(len(f["batches"]) for f in families)
    pro = [sc for sc in bench.SWEEP if sc[0].startswith("pro_h128_b")]
    assert [sc[1] for sc in pro] == next(f["batches"] for f in families
                                         if f["prefix"] == "pro_h128_b")
    assert all(sc[0] == f"pro_h128_b{sc[1]}" and sc[2:5] == (128, 128, 1024) for sc in pro)
