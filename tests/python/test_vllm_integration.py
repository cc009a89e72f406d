# SPDX-License-Identifier: Apache-2.0
"""The vLLM drop-in (sparse_swa.integrations.vllm) against vLLM's own builder, the reference
DeepseekSparseSWAMetadataBuilder run without vLLM through the stubs of
.shared/anchors/vllm_swa_builder.py: both builders constructed from the very same vLLM objects
and fed the very same CommonAttentionMetadata, every metadata field equal (names, types,
dtypes, devices, values), the prefill chunk plans and the draft update too, on random batches
of every mode of scripts/gpu/random_batches.py (decode, MTP, parallel drafting, DSpark
non-causal, chunked prefill, image spans, CUDA-graph padding, mixed).

On a GPU with sparse_swa's CUDA backend: CUDA tensors, 240 batches. Otherwise CPU tensors, our
CPU backend against the reference's Triton kernels in Triton's interpreter, 32 batches, without
image spans (the interpreter cannot run the reference's span kernel; the widths still are). Skipped
without torch and triton, or without the anchor (.shared/anchors or ../shared/anchors)."""

import dataclasses
import importlib
import inspect
import os
import random
import sys
import types
from pathlib import Path

import pytest

import sparse_swa
from vllm_stubs import fresh_dropin

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

REPO = Path(__file__).resolve().parents[2]
ANCHOR = next((d for d in (REPO / ".shared" / "anchors", REPO.parent / "shared" / "anchors")
               if (d / "vllm_swa_builder.py").exists()), None)
if ANCHOR is None:
    pytest.skip("no vllm_swa_builder.py in .shared/anchors or ../shared/anchors",
                allow_module_level=True)
sys.path.insert(0, str(REPO / "scripts" / "gpu"))
import random_batches  # noqa: E402

ON_GPU = torch.cuda.is_available() and sparse_swa.cuda_available()
CASES = 240 if ON_GPU else 32
VISIBLE = ("prefill_left_visible", "prefill_right_visible")


@pytest.fixture(scope="module")
def reference():
    """(anchor module, the reference builder's module, our drop-in module bound to the stubs);
    afterwards the stubs are gone and the drop-in is bound to no vLLM again."""
    env = os.environ.get("TRITON_INTERPRET")
    patched = None
    if not ON_GPU:  # the reference's kernels in Triton's interpreter, on CPU tensors
        os.environ["TRITON_INTERPRET"] = "1"
        from triton.runtime.interpreter import InterpretedFunction

        if not hasattr(InterpretedFunction, "params"):  # the anchor's launcher reads .params
            patched = InterpretedFunction
            InterpretedFunction.params = property(lambda self: [
                types.SimpleNamespace(name=n) for n in inspect.signature(self.fn).parameters])
    sys.path.insert(0, str(ANCHOR))
    try:
        anchor = importlib.import_module("vllm_swa_builder")
        seed = anchor.load_seed()  # installs the vllm stubs
        yield anchor, seed, fresh_dropin()
    finally:
        sys.path.remove(str(ANCHOR))
        for name in list(sys.modules):
            if name == "vllm" or name.startswith("vllm.") or name in ("seed_sparse_swa",
                                                                      "vllm_swa_builder"):
                del sys.modules[name]
        if env is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = env
        if patched is not None:
            del patched.params
        fresh_dropin()


def device():
    return torch.device("cuda" if ON_GPU else "cpu")


def builders(anchor, seed, dropin, config):
    """The reference builder and ours, from the same vLLM objects (the anchor makes them)."""
    ours = anchor.make_builder(types.SimpleNamespace(
        DeepseekSparseSWAMetadataBuilder=dropin.SparseSWAMetadataBuilder), config, device())
    return anchor.make_builder(seed, config, device()), ours


def same_value(a, b):
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                and a.dtype == b.dtype and a.shape == b.shape and a.device == b.device
                and torch.equal(a.cpu(), b.cpu()))
    return type(a) is type(b) and a == b


def differences(ref, ours, plan_requests):
    """Names of the fields (and chunk plans) where the two metadata differ."""
    bad = []
    for f in dataclasses.fields(ref):
        a, b = getattr(ref, f.name), getattr(ours, f.name)
        if f.name.startswith("tile_sched_"):
            ok = (a is None) == (b is None) and (a is None or type(a) is type(b))
        elif f.name in VISIBLE and a is not None and b is not None:
            # Only the prefill rows are defined (the decode rows of the buffer are stale).
            td = ref.num_decode_tokens
            ok = a.shape == b.shape and same_value(a[td:], b[td:])
        else:
            ok = same_value(a, b)
        if not ok:
            bad.append(f.name)
    for ratio, chunk in plan_requests:
        if ref.get_prefill_chunk_plan(ratio, chunk) != ours.get_prefill_chunk_plan(ratio, chunk):
            bad.append(f"get_prefill_chunk_plan({ratio}, {chunk})")
    return bad


# The fields (and the build() parameter) vLLM 0.33 added to the seed's.
NEW_FIELDS = ["replay_start", "cache_slot_mapping", "cache_positions",
              "flashinfer_decode_topk_lens", "flashinfer_decode_seq_lens"]


def test_the_metadata_and_builder_have_vllms_interface(reference):
    anchor, seed, dropin = reference
    seed_fields = {f.name: f for f in dataclasses.fields(seed.DeepseekSparseSWAMetadata)}
    ours = [f for f in dataclasses.fields(dropin.SparseSWAMetadata) if f.name not in NEW_FIELDS]
    assert [f.name for f in ours] == list(seed_fields)  # the seed's, in its order
    for f in ours:
        assert f.default == seed_fields[f.name].default, f.name
    params = list(inspect.signature(dropin.SparseSWAMetadataBuilder.build).parameters)
    assert params == list(inspect.signature(
        seed.DeepseekSparseSWAMetadataBuilder.build).parameters) + ["replay_start"]
    assert issubclass(dropin.SparseSWAMetadataBuilder, sys.modules[
        "vllm.v1.attention.backend"].AttentionMetadataBuilder)
    for attr in ("reorder_batch_threshold", "_cudagraph_support",
                 "supports_draft_decode_metadata_update"):
        assert getattr(dropin.SparseSWAMetadataBuilder, attr) == getattr(
            seed.DeepseekSparseSWAMetadataBuilder, attr), attr


def test_builder_attributes_equal_the_references(reference):
    rng = random.Random(3)
    for i in range(16):
        case = random_batches.make_case(rng, random_batches.MODES[i % len(random_batches.MODES)])
        ref, ours = builders(*reference, case["config"])
        for attr in ("window_size", "block_size", "decode_threshold", "prefill_index_width",
                     "max_image_tokens", "is_dspark", "num_speculative_tokens", "max_model_len",
                     "max_num_batched_tokens", "noncausal_index_width", "head_size",
                     "reorder_batch_threshold", "layer_names"):
            assert getattr(ours, attr) == getattr(ref, attr), (attr, case["config"])
        assert ours._layer_types == ref._layer_types
        for td in (0, 3):
            got, want = ours.build_tile_scheduler(td), ref.build_tile_scheduler(td)
            assert {k: type(v) for k, v in got.items()} == {k: type(v) for k, v in want.items()}


def test_every_field_equals_the_references_on_random_batches(reference):
    anchor = reference[0]
    rng = random.Random(2026)
    failures, updates = [], 0
    for i in range(CASES):
        mode = random_batches.MODES[i % len(random_batches.MODES)]
        case = random_batches.make_case(rng, mode)
        if not ON_GPU:  # Triton's interpreter cannot run the reference's image-span kernel
            case["batch"].pop("image_spans", None)
        ref_builder, ours_builder = builders(*reference, case["config"])
        cm = anchor.to_common(case["batch"], device())  # both read these very tensors
        ref = ref_builder.build(0, cm)
        ours = ours_builder.build(0, cm)
        if ON_GPU:
            torch.cuda.synchronize()
        assert isinstance(ours, reference[2].SparseSWAMetadata)
        plans = [(r["compress_ratio"], r["chunk_size"]) for r in case["chunk_plan_requests"]]
        bad = differences(ref, ours, plans + [(1, 4), (4, 4), (128, 4)])
        if bad:
            failures.append(f"case {i} ({mode}): {', '.join(bad)}")
            continue
        # The fused draft loop on causal decode rows: seq_lens advanced in place, both updated.
        B = case["config"]["block_size"]
        cols = cm.block_table_tensor.shape[1]
        seq = cm.seq_lens_cpu_upper_bound  # every request must still fit its block table
        if case["batch"]["causal"] and ref.num_decode_tokens and bool((seq + 1 <= cols * B).all()):
            cm.seq_lens.add_(1)
            ref_builder.update_draft_decode_metadata(ref)
            ours_builder.update_draft_decode_metadata(ours)
            if ON_GPU:
                torch.cuda.synchronize()
            bad = [n for n in ("decode_swa_indices", "decode_swa_lens")
                   if not same_value(getattr(ref, n), getattr(ours, n))]
            bad += [t for t in ("swaonly", "c4a", "c128a", "c1a", "c2a")
                    if (getattr(ref, f"tile_sched_{t}") is None)
                    != (getattr(ours, f"tile_sched_{t}") is None)]
            if bad:
                failures.append(f"case {i} ({mode}) after the draft update: {', '.join(bad)}")
            updates += 1
    assert not failures, f"{len(failures)} of {CASES} batches differ:\n" + "\n".join(failures)
    assert updates >= CASES // 8  # the draft update ran on a fair share of the batches
    print(f"{CASES} batches equal to the reference ({updates} with a draft update), "
          f"{'cuda' if ON_GPU else 'cpu (Triton interpreter)'}")


@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU and sparse_swa's CUDA backend")
def test_draft_update_captured_in_a_cuda_graph_replays_like_the_reference(reference):
    # vLLM's fused draft loop captures update_draft_decode_metadata and advances seq_lens in
    # place between replays.
    anchor = reference[0]
    rng = random.Random(5)
    block, reqs = 32, 8
    config = {"window_size": 64, "block_size": block, "max_num_batched_tokens": 64,
              "max_num_seqs": reqs, "max_model_len": 2048, "num_speculative_tokens": 0,
              "speculative_method": "none", "parallel_drafting": False, "max_image_tokens": 0,
              "compress_ratios": [1, 4]}
    cols = config["max_model_len"] // block
    pages = rng.sample(range(10000), reqs * cols)
    bt = [pages[r * cols:(r + 1) * cols] for r in range(reqs)]
    seq = [rng.randint(1, 1500) for _ in range(reqs)]
    batch = {"query_start_loc": list(range(reqs + 1)), "seq_lens": seq, "block_table": bt,
             "slot_mapping": [bt[r][(s - 1) // block] * block + (s - 1) % block
                              for r, s in enumerate(seq)], "causal": True}
    ref_builder, ours_builder = builders(*reference, config)
    cm = anchor.to_common(batch, device())
    ref, ours = ref_builder.build(0, cm), ours_builder.build(0, cm)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture
        ours_builder.update_draft_decode_metadata(ours)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ours_builder.update_draft_decode_metadata(ours)
    for _ in range(3):
        cm.seq_lens.add_(1)  # both builders' metadata hold this very tensor
        graph.replay()
        ref_builder.update_draft_decode_metadata(ref)
        torch.cuda.synchronize()
        assert torch.equal(ours.decode_swa_indices, ref.decode_swa_indices)
        assert torch.equal(ours.decode_swa_lens, ref.decode_swa_lens)
    assert ours.decode_swa_lens.tolist() == [min(s + 3, 64) for s in seq]
