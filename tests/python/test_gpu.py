# SPDX-License-Identifier: Apache-2.0
"""GPU checks (`scripts/gpu/check.sh python`): PyTorch CUDA tensors in, the CUDA backend,
outputs that are device pointers into persistent buffers, results equal to the CPU path. Skipped
without torch or a CUDA device; the torch CPU test runs wherever torch is installed."""

import ctypes
import json
import random

import numpy as np
import pytest

import sparse_swa
from conftest import EXAMPLES, batch_arrays, image_spans, load_case
from test_random_batches import random_batch, random_config

torch = pytest.importorskip("torch")
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
backend = pytest.mark.skipif(not sparse_swa.cuda_available(),
                             reason="sparse_swa built without the CUDA backend")

ARRAYS = ["decode_swa_indices", "decode_swa_lens", "prefill_swa_indices", "prefill_swa_lens",
          "prefill_left_visible", "prefill_right_visible", "prefill_gather_lens",
          "token_to_req_indices", "is_valid_token"]
HOST_ARRAYS = ["prefill_seq_lens_cpu", "prefill_query_lens_cpu"]
SCALARS = ["num_decodes", "num_prefills", "num_decode_tokens", "num_prefill_tokens",
           "max_decode_query_len", "decode_swa_width", "tile_schedulers", "num_tokens"]


def to_torch(arrays, device):
    return [torch.from_numpy(a.copy()).to(device) for a in arrays]


def cuda_build(builder, arrays, **kw):
    qsl, seq, bt, slots = to_torch(arrays, "cuda")
    return builder.build(qsl, seq, bt, slots, query_start_loc_cpu=torch.from_numpy(arrays[0]),
                         seq_lens_cpu=torch.from_numpy(arrays[1].copy()), **kw)


def assert_same(gpu, cpu):
    for name in SCALARS:
        assert getattr(gpu, name) == getattr(cpu, name), name
    for name in ARRAYS:
        g, c = getattr(gpu, name), getattr(cpu, name)
        assert (g is None) == (c is None), name
        if g is not None:
            assert g.is_cuda, name
            np.testing.assert_array_equal(g.cpu().numpy(), c, err_msg=name)
    for name in HOST_ARRAYS:
        g, c = getattr(gpu, name), getattr(cpu, name)
        assert (g is None) == (c is None), name
        if g is not None:
            assert g.device.type == "cpu", name
            np.testing.assert_array_equal(g.numpy(), c, err_msg=name)
    for ratio in (1, 4, 128):
        assert gpu.get_prefill_chunk_plan(ratio, 4) == cpu.get_prefill_chunk_plan(ratio, 4)


def poison(md):
    for name in ARRAYS:
        a = getattr(md, name)
        if a is not None:
            a.fill_(True if a.dtype == torch.bool else -7)


def memory_type(ptr):
    """cudaPointerGetAttributes(ptr).type: 2 = device, 0/1 = host; None if cudart is not found."""
    for name in ("libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"):
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError:
            continue
    else:
        return None

    # cudaPointerAttributes starts with {int type; int device; ...} and has grown across CUDA
    # versions: give the call a generous buffer and read the first field only.
    attrs = ctypes.create_string_buffer(1024)
    if lib.cudaPointerGetAttributes(attrs, ctypes.c_void_p(ptr)) != 0:
        lib.cudaGetLastError()
        return None
    return ctypes.c_int.from_buffer(attrs, 0).value


def test_torch_cpu_tensors_use_the_cpu_backend(mixed_case):
    builder = sparse_swa.MetadataBuilder(mixed_case["config"])
    qsl, seq, bt, slots = (torch.from_numpy(a) for a in batch_arrays(mixed_case["batch"]))
    md = builder.build(qsl, seq, bt, slots)
    assert md.backend == "cpu" and isinstance(md.decode_swa_indices, torch.Tensor)
    assert md.decode_swa_indices.shape == (3, 1, 8) and md.is_valid_token.dtype == torch.bool
    assert md.decode_swa_lens.tolist() == [8, 5, 6]
    assert md.copy().decode_swa_indices.data_ptr() != md.decode_swa_indices.data_ptr()


@cuda
@backend
@pytest.mark.parametrize("name", sorted(p.name[:-len(".expected.json")]
                                        for p in EXAMPLES.glob("*.expected.json")))
def test_golden_cases_on_cuda_equal_cpu(name):
    case = load_case(name)
    arrays = batch_arrays(case["batch"])
    kw = {"causal": case["batch"].get("causal", True), "image_spans": image_spans(case["batch"])}
    cpu = sparse_swa.MetadataBuilder(case["config"]).build(*arrays, **kw)
    builder = sparse_swa.MetadataBuilder(case["config"])
    poison(cuda_build(builder, arrays, **kw))
    gpu = cuda_build(builder, arrays, **kw)
    torch.cuda.synchronize()
    assert gpu.backend == "cuda"
    assert_same(gpu, cpu)
    expected = json.loads((EXAMPLES / f"{name}.expected.json").read_text())
    assert gpu.decode_swa_lens.tolist() == expected["decode_swa_lens"]


@cuda
@backend
def test_outputs_are_device_pointers_into_persistent_buffers(mixed_case):
    arrays = batch_arrays(mixed_case["batch"])
    builder = sparse_swa.MetadataBuilder(mixed_case["config"])
    inputs = to_torch(arrays, "cuda")
    md = builder.build(*inputs, query_start_loc_cpu=torch.from_numpy(arrays[0]),
                       seq_lens_cpu=torch.from_numpy(arrays[1]))
    assert md.query_start_loc is inputs[0] and md.block_table is inputs[2]  # no copies
    ptrs = {}
    for name in ARRAYS:
        a = getattr(md, name)
        if a is None:
            continue
        assert a.is_cuda and a.device == inputs[0].device, name
        kind = memory_type(a.data_ptr())
        assert kind in (None, 2), f"{name}: cudaMemoryType {kind}, expected device"
        assert all(a.data_ptr() != t.data_ptr() for t in inputs), name
        ptrs[name] = a.data_ptr()
    for name in HOST_ARRAYS:
        assert getattr(md, name).device.type == "cpu"
    again = cuda_build(builder, arrays)
    for name, ptr in ptrs.items():
        assert getattr(again, name).data_ptr() == ptr, f"{name} moved between builds"
    assert not md.is_current and again.is_current
    snap = again.copy()
    assert snap.decode_swa_indices.is_cuda
    assert snap.decode_swa_indices.data_ptr() != again.decode_swa_indices.data_ptr()
    torch.cuda.synchronize()
    assert torch.equal(snap.decode_swa_indices, again.decode_swa_indices)


@cuda
@backend
@pytest.mark.parametrize("seed", range(4))
def test_random_batches_cuda_equal_cpu(seed):
    rng = random.Random(100 + seed)
    for _ in range(10):
        config, theta = random_config(rng)
        cpu_builder = sparse_swa.MetadataBuilder(config)
        gpu_builder = sparse_swa.MetadataBuilder(config)
        for _ in range(3):
            arrays, causal = random_batch(rng, config, theta)
            arrays = [np.ascontiguousarray(a) for a in arrays]
            cpu = cpu_builder.build(*arrays, causal=causal)
            gpu = cuda_build(gpu_builder, arrays, causal=causal)
            torch.cuda.synchronize()
            assert_same(gpu, cpu)


@cuda
@backend
def test_draft_update_on_cuda_equals_cpu():
    case = load_case("dspark_draft")
    arrays = batch_arrays(case["batch"])
    cpu_builder = sparse_swa.MetadataBuilder(case["config"])
    cpu = cpu_builder.build(*arrays, causal=False)
    gpu_builder = sparse_swa.MetadataBuilder(case["config"])
    gpu = cuda_build(gpu_builder, arrays, causal=False)
    seq = arrays[1]
    seq += 1  # the CPU builder's metadata holds this very array
    gpu.seq_lens.add_(1)  # the engine advances the device seq_lens in place
    cpu_builder.update_draft_decode_metadata(cpu)
    gpu_builder.update_draft_decode_metadata(gpu, seq_lens_cpu=torch.from_numpy(seq))
    torch.cuda.synchronize()
    assert_same(gpu, cpu)
    assert gpu.decode_swa_lens.tolist() == [11, 11, 11, 6, 6, 6]  # non-causal rows kept
    # The host copy as the build left it (the draft loop does not advance it) is accepted.
    gpu.seq_lens.add_(1)
    seq += 1
    cpu_builder.update_draft_decode_metadata(cpu)
    gpu_builder.update_draft_decode_metadata(gpu)
    torch.cuda.synchronize()
    assert_same(gpu, cpu)


@cuda
@backend
def test_builder_on_a_side_stream(mixed_case):
    arrays = batch_arrays(mixed_case["batch"])
    stream = torch.cuda.Stream()
    builder = sparse_swa.MetadataBuilder(mixed_case["config"], device="cuda",
                                         cuda_stream=stream.cuda_stream)
    assert builder.backends == ["cuda"]
    inputs = to_torch(arrays, "cuda")
    torch.cuda.synchronize()
    # Torch tensors default to torch's current stream (test_device_paths.py checks where work
    # lands); the creation-time stream is the default of other producers, or given per call.
    md = builder.build(*inputs, query_start_loc_cpu=torch.from_numpy(arrays[0]),
                       seq_lens_cpu=torch.from_numpy(arrays[1]), stream=stream)
    stream.synchronize()
    cpu = sparse_swa.MetadataBuilder(mixed_case["config"]).build(*arrays)
    assert_same(md, cpu)


@cuda
@pytest.mark.skipif(sparse_swa.cuda_available(), reason="checks a build without the CUDA backend")
def test_cuda_tensors_without_backend_raise_runtime_error(mixed_case):
    arrays = batch_arrays(mixed_case["batch"])
    with pytest.raises(RuntimeError, match="backend cuda"):
        cuda_build(sparse_swa.MetadataBuilder(mixed_case["config"]), arrays)


@cuda
@backend
def test_build_groups_on_cuda_equal_each_groups_cpu_build():
    # Three KV-cache groups of one step (window and page size differ), one launch, with replay.
    from test_build_groups import three_groups
    builders, shapes, qsl, seq, bts, sms = three_groups()
    replay = [None, np.array([3, 0, 2], np.int32), None]
    dev = lambda a: torch.from_numpy(a.copy()).cuda()
    mds = sparse_swa.MetadataBuilder.build_groups(
        builders, dev(qsl), dev(seq), [dev(b) for b in bts], [dev(s) for s in sms],
        query_start_loc_cpu=torch.from_numpy(qsl), seq_lens_cpu=torch.from_numpy(seq.copy()),
        replay_starts=[None if r is None else dev(r) for r in replay])
    for g, (w, b) in enumerate(shapes):
        cpu = sparse_swa.MetadataBuilder(builders[g].config).build(
            qsl, seq, bts[g], sms[g], replay_start=replay[g])
        assert_same(mds[g], cpu)
        np.testing.assert_array_equal(mds[g].replay_start.cpu().numpy(), cpu.replay_start)
