# SPDX-License-Identifier: Apache-2.0
"""The vLLM drop-in against vLLM 0.33's own builders, run from the upstream files through
scripts/gpu/vllm033_builder.py (.shared/upstream/vllm-0.33.0 or ../shared/upstream/vllm-0.33.0):
install() hands vLLM's real DeepSeek-V4/V4.1 backend classes our builders; both builders are
constructed from the very same vLLM objects, fed the very same CommonAttentionMetadata and
replay_start, and every metadata field must be equal (names, types, dtypes, shapes, devices,
values), the prefill chunk plans and the draft update too. Random batches of every mode of
scripts/gpu/random_batches.py --vllm033 (decode, MTP, parallel drafting on either model runner,
DSpark non-causal, chunked prefill, image spans with DeepSeek-V4 configs and others, V4.1
configs, CUDA-graph padding, mixed; V4 and V4.1 builders: base, FlashMLA, FlashInfer;
replay_start non-zero in a third), plus the shipped examples.

On a GPU with sparse_swa's CUDA backend: CUDA tensors, 360 batches. Otherwise CPU tensors, our
CPU backend against vLLM's Triton kernels in Triton's interpreter, 48 batches, without the image
spans that widen rows (the interpreter cannot run vLLM's span kernel). Skipped without torch and
triton, or without the upstream tree. The bounded-replay builds and the draft updates need a
sparse_swa build with them (SwaMetadata.replay_start) and are skipped on one without."""

import dataclasses
import inspect
import json
import os
import random
import sys
from pathlib import Path

import pytest

import sparse_swa
from vllm_stubs import installed_on, run_in_fresh_interpreter

torch = pytest.importorskip("torch")
ON_GPU = torch.cuda.is_available() and sparse_swa.cuda_available()
if not ON_GPU and "triton" not in sys.modules:
    # Triton reads TRITON_INTERPRET when it is imported (its own library functions too); on a
    # machine without a GPU its kernels run nowhere else.
    os.environ["TRITON_INTERPRET"] = "1"
triton = pytest.importorskip("triton")
# Triton was imported before TRITON_INTERPRET=1 could be set: this file runs in a fresh one.
RERUN = not ON_GPU and isinstance(triton.language.standard.sum, triton.runtime.JITFunction)

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts" / "gpu"))
import random_batches  # noqa: E402
import vllm033_builder as v033  # noqa: E402

ROOT = v033.upstream_root()
if ROOT is None:
    pytest.skip("no vllm-0.33.0 tree in .shared/upstream or ../shared/upstream",
                allow_module_level=True)
CASES = 360 if ON_GPU else 48
NEEDS_REPLAY = pytest.mark.skipif(
    not hasattr(sparse_swa.SwaMetadata, "replay_start"),
    reason="this sparse_swa build has no bounded replay nor vLLM 0.33's draft update "
           "(sparse_swa.SwaMetadata has no replay_start)")
# The attention classes of the model files and the (model, builder) of their SWA backend.
ATTENTION = [
    ("vllm.models.deepseek_v4.nvidia.flashmla", "DeepseekV4FlashMLAAttention", "v4", "flashmla"),
    ("vllm.models.deepseek_v4.nvidia.flashinfer_sparse", "DeepseekV4FlashInferMLAAttention", "v4",
     "flashinfer"),
    ("vllm.models.deepseek_v4.nvidia.flashinfer_sparse", "DeepseekV4FlashInferSM120Attention",
     "v4", "flashinfer"),
    ("vllm.models.deepseek_v41.nvidia.flashmla", "DeepseekV4FlashMLAAttention", "v41",
     "flashmla"),
    ("vllm.models.deepseek_v41.nvidia.flashinfer_sparse", "DeepseekV4FlashInferMLAAttention",
     "v41", "flashinfer"),
    ("vllm.models.deepseek_v41.nvidia.flashinfer_sparse", "DeepseekV4FlashInferSM120Attention",
     "v41", "flashinfer"),
]


@pytest.fixture(scope="module")
def vllm033():
    """(the loaded upstream modules, the drop-in bound to them, install()'s Installation);
    afterwards vLLM's modules are gone and the drop-in is bound to no vLLM again."""
    if RERUN:
        pytest.skip("runs in a fresh interpreter (test_in_a_fresh_interpreter)")
    with installed_on(lambda: v033.load(ROOT), v033.unload, ON_GPU) as session:
        yield session


@pytest.mark.skipif(not RERUN, reason="Triton runs in this process")
def test_in_a_fresh_interpreter():
    print(run_in_fresh_interpreter(__file__)[-2000:])


def device():
    return torch.device("cuda" if ON_GPU else "cpu")


def widens(case):
    v = case.get("vllm033", {})
    return (case["config"].get("max_image_tokens", 0) > 0 and v.get("model", "v4") == "v4"
            and v.get("hf_config", {}).get("class", "DeepseekV4Config") == "DeepseekV4Config")


def random_cases(count=CASES, seed=2033):
    rng = random.Random(seed)
    out = []
    for i in range(count):
        mode = random_batches.MODES[i % len(random_batches.MODES)]
        case = random_batches.make_case(rng, mode, vllm033=True)
        if not ON_GPU and widens(case):
            case["batch"].pop("image_spans", None)
        out.append((f"case {i} ({mode}, {case['vllm033']['model']} "
                    f"{case['vllm033']['builder']})", case))
    return out


def replays(case):
    return any(case["batch"].get("replay_start") or [])


def builders(vllm033, case):
    """vLLM's builder and ours for a case, from the same vLLM objects; ours is what the
    installed backend hands out (or the drop-in's base builder for vLLM's base)."""
    loaded, dropin, _ = vllm033
    kv, vc = v033.vllm_objects(case)
    v = case.get("vllm033", {})
    key = (v.get("model", "v4"), v.get("builder", "base"))
    if key in v033.BACKENDS:
        module, name = v033.BACKENDS[key]
        ours_cls = getattr(loaded.modules[module], name).get_builder_cls()
    else:
        ours_cls = (dropin.SparseSWAV41MetadataBuilder if key[0] == "v41"
                    else dropin.SparseSWAMetadataBuilder)
    make = lambda cls: cls(kv, ["layer.0"], vc, device())  # noqa: E731
    return make(v033.vllm_builder_cls(loaded, case)), make(ours_cls)


def sync():
    if ON_GPU:
        torch.cuda.synchronize()


def compare(vllm033, name, case, update=False):
    """The fields that differ after build() (and, with update, after the draft update)."""
    ref_builder, ours_builder = builders(vllm033, case)
    cm = v033.common(vllm033[0], case["batch"], device())
    rs = v033.replay_start(case["batch"], device())
    ref, ours = ref_builder.build(0, cm, replay_start=rs), ours_builder.build(0, cm,
                                                                              replay_start=rs)
    sync()
    assert isinstance(ours, vllm033[1].SparseSWAMetadata)
    plans = [(r["compress_ratio"], r["chunk_size"]) for r in case.get("chunk_plan_requests", [])]
    bad = [f"{name}: {f}" for f in v033.differences(ref, ours, plans + [(1, 4), (4, 4)])]
    if update and not bad and case.get("draft_update") and ref.num_decode_tokens:
        v033.apply_draft_update(cm, case["draft_update"])
        ref_builder.update_draft_decode_metadata(ref)
        ours_builder.update_draft_decode_metadata(ours)
        sync()
        bad += [f"{name} after the draft update: {f}" for f in v033.differences(ref, ours)]
    return bad


def test_install_hands_vllms_attention_layers_our_builders(vllm033):
    loaded, dropin, installation = vllm033
    base = loaded.sparse_swa.DeepseekSparseSWAMetadataBuilder
    always = loaded.backend.AttentionCGSupport.ALWAYS
    # Four builders (and vLLM's DeepSeek-V4 FlashMLA attention class: test_vllm_attention_gpu.py).
    assert installation.skipped == {}
    assert [p.target.kind for p in installation.patches] == ["swa_builder"] * 4 + ["attention"]
    for module, attention, model, kind in ATTENTION:
        backend = getattr(loaded.modules[module], attention).swa_backend_cls
        handed_out = backend.get_builder_cls()
        vllm_module, vllm_name = v033.BUILDERS[(model, kind)]
        vllm_cls = getattr(loaded.modules[vllm_module], vllm_name)
        assert handed_out is installation.builder_cls(backend), attention
        assert issubclass(handed_out, vllm_cls) and issubclass(handed_out, base)
        assert issubclass(handed_out, dropin.SparseSWAMetadataBuilder)
        assert handed_out.build is not vllm_cls.build  # our methods, vLLM's identity
        assert handed_out._cudagraph_support == vllm_cls._cudagraph_support == always
    again = dropin.install(sys.modules["vllm"])
    assert [p.handed_out for p in again.patches] == [p.handed_out for p in installation.patches]
    # vLLM's model state hands replay_start only to instances of its base builder.
    case = random_cases(1)[0][1]
    kv, vc = v033.vllm_objects(case)
    assert isinstance(installation.patches[0].handed_out(kv, ["l"], vc, device()), base)


def test_metadata_and_build_have_vllms_interface(vllm033):
    loaded, dropin, _ = vllm033
    ref_fields = dataclasses.fields(loaded.sparse_swa.DeepseekSparseSWAMetadata)
    ours_fields = dataclasses.fields(dropin.SparseSWAMetadata)
    assert [f.name for f in ours_fields] == [f.name for f in ref_fields]
    assert [f.default for f in ours_fields] == [f.default for f in ref_fields]
    want = list(inspect.signature(loaded.sparse_swa.DeepseekSparseSWAMetadataBuilder.build)
                .parameters)
    assert list(inspect.signature(dropin.SparseSWAMetadataBuilder.build).parameters) == want
    for attr in ("reorder_batch_threshold", "_cudagraph_support",
                 "supports_draft_decode_metadata_update"):
        assert getattr(dropin.SparseSWAMetadataBuilder, attr) == getattr(
            loaded.sparse_swa.DeepseekSparseSWAMetadataBuilder, attr), attr


def test_builder_attributes_equal_vllms(vllm033):
    for name, case in random_cases(24, seed=7):
        ref, ours = builders(vllm033, case)
        for attr in ("window_size", "block_size", "decode_threshold", "prefill_index_width",
                     "max_image_tokens", "is_dspark", "num_speculative_tokens", "max_model_len",
                     "max_num_batched_tokens", "noncausal_index_width", "head_size",
                     "compress_ratio", "reorder_batch_threshold", "layer_names", "_layer_types",
                     "_max_tokens", "_cudagraph_support"):
            assert getattr(ours, attr) == getattr(ref, attr), (name, attr)
        for td in (0, 3):
            got, want = ours.build_tile_scheduler(td), ref.build_tile_scheduler(td)
            assert {k: type(v) for k, v in got.items()} == {k: type(v) for k, v in want.items()}


def test_builds_without_replay_equal_vllms(vllm033):
    cases = [(n, c) for n, c in random_cases() if not replays(c)]
    failures = [f for n, c in cases for f in compare(vllm033, n, c)]
    assert not failures, f"{len(failures)} differences:\n" + "\n".join(failures)
    assert len(cases) >= CASES // 2
    print(f"{len(cases)} builds without replay equal vLLM 0.33's")


@NEEDS_REPLAY
def test_builds_with_replay_equal_vllms(vllm033):
    cases = [(n, c) for n, c in random_cases() if replays(c)]
    failures = [f for n, c in cases for f in compare(vllm033, n, c)]
    assert not failures, f"{len(failures)} differences:\n" + "\n".join(failures)
    assert len(cases) >= CASES // 4
    print(f"{len(cases)} builds with a non-zero replay_start equal vLLM 0.33's")


@NEEDS_REPLAY
def test_draft_updates_equal_vllms(vllm033):
    cases = [(n, c) for n, c in random_cases() if c.get("draft_update")]
    failures = [f for n, c in cases for f in compare(vllm033, n, c, update=True)]
    assert not failures, f"{len(failures)} differences:\n" + "\n".join(failures)
    noncausal = sum(not c["batch"]["causal"] for _, c in cases)
    assert len(cases) >= CASES // 2 and noncausal >= CASES // 20
    print(f"{len(cases)} draft updates ({noncausal} non-causal) equal vLLM 0.33's")


def example_cases():
    files = sorted((REPO / "examples" / "batches").glob("*.json"))
    files += sorted((ROOT.parents[1] / "anchors" / "examples").glob("*.json"))
    for f in files:
        if f.name.endswith(".expected.json"):
            continue
        case = json.loads(f.read_text())
        for model, kind in (("v4", "base"), ("v4", "flashmla"), ("v41", "flashinfer")):
            hf = {"class": "DeepseekV4Config"} if model == "v4" else {
                "class": "other", "compress_ratios": [0, 1, 2]}
            c = dict(case, vllm033={"model": model, "builder": kind, "hf_config": hf})
            if not ON_GPU and widens(c):
                continue
            yield f"{f.parent.name}/{f.name} as {model} {kind}", c


def test_examples_equal_vllms(vllm033):
    cases = list(example_cases())
    failures = [f for n, c in cases for f in compare(vllm033, n, c)]
    assert not failures, "\n".join(failures)
    assert len(cases) >= 12


def test_pcp_passes_this_ranks_slots_and_the_gathered_cache_slots(vllm033):
    for rank in (0, 1):
        for name, case in random_cases(6, seed=11):
            case["vllm033"].update(model="v41", builder="flashmla",
                                   hf_config={"class": "other"}, pcp={"size": 2, "rank": rank})
            b = case["batch"]
            b.pop("replay_start", None)
            other = [s if s < 0 else s + 1 for s in b["slot_mapping"]]  # the other rank's share
            b["num_actual_tokens"] = len(b["slot_mapping"])
            b["slot_mapping"] = (b["slot_mapping"] + other if rank == 0
                                 else other + b["slot_mapping"])
            assert compare(vllm033, f"{name} pcp rank {rank}", case) == []


@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU and sparse_swa's CUDA backend")
@NEEDS_REPLAY
def test_draft_update_captured_in_a_cuda_graph_replays_like_vllms(vllm033):
    # vLLM's draft loop captures update_draft_decode_metadata once and replays it after the
    # engine rewrote seq_lens, slot_mapping and query_start_loc in place.
    done = 0
    for name, case in random_cases(64, seed=21):
        if not case.get("draft_update"):
            continue
        ref_builder, ours_builder = builders(vllm033, case)
        cm = v033.common(vllm033[0], case["batch"], device())
        rs = v033.replay_start(case["batch"], device())
        ref, ours = ref_builder.build(0, cm, replay_start=rs), ours_builder.build(
            0, cm, replay_start=rs)
        if not ref.num_decode_tokens:
            continue
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the capture
            ours_builder.update_draft_decode_metadata(ours)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            ours_builder.update_draft_decode_metadata(ours)
        v033.apply_draft_update(cm, case["draft_update"])
        graph.replay()
        ref_builder.update_draft_decode_metadata(ref)
        torch.cuda.synchronize()
        assert v033.differences(ref, ours) == [], name
        done += 1
    assert done >= 8
