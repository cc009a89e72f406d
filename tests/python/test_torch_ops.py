# SPDX-License-Identifier: Apache-2.0
"""torch.ops.sparse_swa.* (sparse_swa.torch_ops): schemas, fake implementations, results equal to
the plain functions, torch.compile(fullgraph=True) over the ops, and on a GPU the CUDA path, the
current-stream rule and CUDA graph capture of build + attention. Skipped without torch; the GPU
tests skip without CUDA."""

import numpy as np
import pytest

import sparse_swa

torch = pytest.importorskip("torch")
import sparse_swa.torch_ops  # noqa: E402,F401  registers the ops

ops = torch.ops.sparse_swa
cuda = pytest.mark.skipif(not (torch.cuda.is_available() and sparse_swa.cuda_available()),
                          reason="needs a CUDA GPU and sparse_swa's CUDA backend")
BLOCK = 64


def bits_to_bf16(bits):
    return torch.from_numpy(np.asarray(bits).view(np.int16)).view(torch.bfloat16)


def step_inputs(device="cpu", tokens=5, heads=4, width=8, seed=0):
    """A cache of 2 pages with 20 encoded keys, queries and [T, 1, W] rows over the keys."""
    g = torch.Generator().manual_seed(seed)
    page = sparse_swa.page_layout(BLOCK)["page_bytes"]
    cache = torch.zeros((2, page), dtype=torch.uint8)
    keys = torch.randn((20, 512), generator=g)
    key_slots = torch.randperm(2 * BLOCK, generator=g)[:20].to(torch.int64)
    rows = torch.full((tokens, 1, width), -1, dtype=torch.int32)
    lens = torch.randint(0, width + 1, (tokens,), generator=g, dtype=torch.int32)
    for t in range(tokens):
        n = int(lens[t])
        rows[t, 0, :n] = key_slots[torch.randperm(20, generator=g)[:n]].to(torch.int32)
    q = torch.randn((tokens, heads, 512), generator=g).to(torch.bfloat16)
    sinks = torch.randn(heads, generator=g)
    out = dict(cache=cache, keys=keys, key_slots=key_slots, q=q, rows=rows, lens=lens,
               sinks=sinks)
    return {k: v.to(device) for k, v in out.items()}


def test_ops_are_registered_with_schemas():
    schema = str(ops.sparse_attention.default._schema)
    assert schema.startswith("sparse_swa::sparse_attention(Tensor q, Tensor swa_cache, ")
    assert "int swa_block_size" in schema and 'str dtype="fp8_ds_mla"' in schema
    assert "Tensor? extra_indices=None" in schema and schema.endswith("-> (Tensor, Tensor)")
    assert "Tensor(a!) cache" in str(ops.encode_kv.default._schema)
    out_schema = str(ops.sparse_attention_out.default._schema)
    assert "Tensor(a!) out, Tensor(b!) lse" in out_schema
    assert "Tensor(c!)? workspace=None" in out_schema
    assert str(ops.decode_kv.default._schema).endswith("-> Tensor")


def test_codec_ops_equal_the_plain_functions():
    s = step_inputs()
    expected = s["cache"].numpy().copy()
    sparse_swa.encode_kv(expected, BLOCK, s["keys"].numpy(), s["key_slots"].numpy())
    ops.encode_kv(s["cache"], BLOCK, s["keys"], s["key_slots"])
    assert np.array_equal(s["cache"].numpy(), expected)
    back = ops.decode_kv(s["cache"], BLOCK, s["key_slots"])
    assert back.dtype == torch.float32 and back.shape == (20, 512)
    assert np.array_equal(back.numpy(), sparse_swa.decode_kv(expected, BLOCK,
                                                             s["key_slots"].numpy()))
    # bf16 rows are taken as their float32 values.
    again = torch.zeros_like(s["cache"])
    ops.encode_kv(again, BLOCK, s["keys"].to(torch.bfloat16), s["key_slots"])
    plain = np.zeros_like(expected)
    sparse_swa.encode_kv(plain, BLOCK, s["keys"].to(torch.bfloat16).float().numpy(),
                         s["key_slots"].numpy())
    assert np.array_equal(again.numpy(), plain)


def test_attention_op_equals_the_plain_function():
    s = step_inputs()
    ops.encode_kv(s["cache"], BLOCK, s["keys"], s["key_slots"])
    out, lse = ops.sparse_attention(s["q"], s["cache"], BLOCK, s["rows"], s["lens"],
                                    sinks=s["sinks"])
    q_bits = s["q"].view(torch.int16).numpy().view(np.uint16)
    ref_out, ref_lse = sparse_swa.sparse_attention(q_bits, s["cache"].numpy(), BLOCK,
                                                   s["rows"][:, 0].numpy(), s["lens"].numpy(),
                                                   sinks=s["sinks"].numpy())
    assert out.dtype == torch.bfloat16 and out.shape == s["q"].shape
    assert lse.dtype == torch.float32 and lse.shape == s["q"].shape[:2]
    assert torch.equal(out, bits_to_bf16(ref_out))
    assert torch.equal(lse, torch.from_numpy(ref_lse))
    # The out variant writes the same values in place.
    out2, lse2 = torch.zeros_like(out), torch.zeros_like(lse)
    ops.sparse_attention_out(s["q"], s["cache"], BLOCK, s["rows"], s["lens"], out2, lse2,
                             sinks=s["sinks"])
    assert torch.equal(out2, out) and torch.equal(lse2, lse)
    # A workspace is taken (the CPU backend needs none).
    out3, lse3 = torch.zeros_like(out), torch.zeros_like(lse)
    ops.sparse_attention_out(s["q"], s["cache"], BLOCK, s["rows"], s["lens"], out3, lse3,
                             sinks=s["sinks"], workspace=torch.zeros(64, dtype=torch.uint8))
    assert torch.equal(out3, out) and torch.equal(lse3, lse)


def test_to_ragged_op_pads_flat_to_capacity():
    rows = torch.tensor([[[1, 2, 3]], [[4, 5, 6]]], dtype=torch.int32)
    indptr, flat = ops.to_ragged(rows, torch.tensor([3, 1], dtype=torch.int32))
    assert indptr.tolist() == [0, 3, 4]
    assert flat.tolist() == [1, 2, 3, 4, -1, -1]


def test_fake_implementations_give_the_output_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.empty((7, 16, 512), dtype=torch.bfloat16)
        cache = torch.empty((3, 37440), dtype=torch.uint8)
        rows = torch.empty((7, 1, 128), dtype=torch.int32)
        lens = torch.empty(7, dtype=torch.int32)
        out, lse = ops.sparse_attention(q, cache, BLOCK, rows, lens, extra_cache=cache,
                                        extra_block_size=64, extra_indices=rows,
                                        extra_lens=lens)
        assert out.shape == (7, 16, 512) and out.dtype == torch.bfloat16
        assert lse.shape == (7, 16) and lse.dtype == torch.float32
        back = ops.decode_kv(cache, BLOCK, torch.empty(9, dtype=torch.int64))
        assert back.shape == (9, 512) and back.dtype == torch.float32
        indptr, flat = ops.to_ragged(rows, lens)
        assert indptr.shape == (8,) and flat.shape == (7 * 128,)
        with pytest.raises(ValueError, match=r"q: expected shape \[T, H, 512\], got \[7, 16\]"):
            ops.sparse_attention(q[:, :, 0], cache, BLOCK, rows, lens)


def test_op_errors_name_the_argument():
    s = step_inputs()
    with pytest.raises(ValueError, match="q: expected dtype torch.bfloat16, got torch.float32"):
        ops.sparse_attention(s["q"].float(), s["cache"], BLOCK, s["rows"], s["lens"])
    with pytest.raises(ValueError, match="lens"):
        ops.sparse_attention(s["q"], s["cache"], BLOCK, s["rows"], s["lens"][:2])
    with pytest.raises(ValueError, match="slot"):
        ops.encode_kv(s["cache"], BLOCK, s["keys"][:1], torch.tensor([2 * BLOCK]))


def test_opcheck_on_cpu():
    s = step_inputs()
    ops.encode_kv(s["cache"], BLOCK, s["keys"], s["key_slots"])
    torch.library.opcheck(ops.sparse_attention.default,
                          (s["q"], s["cache"], BLOCK, s["rows"], s["lens"]))
    torch.library.opcheck(ops.decode_kv.default, (s["cache"], BLOCK, s["key_slots"]))
    torch.library.opcheck(ops.encode_kv.default,
                          (s["cache"].clone(), BLOCK, s["keys"], s["key_slots"]))
    torch.library.opcheck(ops.to_ragged.default, (s["rows"], s["lens"]))
    out, lse = ops.sparse_attention(s["q"], s["cache"], BLOCK, s["rows"], s["lens"])
    for workspace in (None, torch.zeros(64, dtype=torch.uint8)):
        torch.library.opcheck(ops.sparse_attention_out.default,
                              (s["q"], s["cache"], BLOCK, s["rows"], s["lens"],
                               torch.empty_like(out), torch.empty_like(lse)),
                              {"workspace": workspace})


def layer_step(cache, keys, key_slots, q, rows, lens, sinks):
    """Calls every op: encode, decode, attention (both variants), ragged rows."""
    ops.encode_kv(cache, BLOCK, keys, key_slots)
    back = ops.decode_kv(cache, BLOCK, key_slots)
    out, lse = ops.sparse_attention(q, cache, BLOCK, rows, lens, sinks=sinks)
    out2 = torch.empty_like(out)
    lse2 = torch.empty_like(lse)
    ops.sparse_attention_out(q, cache, BLOCK, rows, lens, out2, lse2)
    indptr, flat = ops.to_ragged(rows, lens)
    return back.sum(dim=1), out.float() * 2, lse + 1, out2, lse2, indptr, flat


def compiled_equals_eager(device, backend):
    eager_in = step_inputs(device)
    compiled_in = step_inputs(device)
    expected = layer_step(**eager_in)
    torch._dynamo.reset()
    got = torch.compile(layer_step, fullgraph=True, backend=backend)(**compiled_in)
    for e, g in zip(expected, got):  # inductor may sum in another order: float tolerance
        assert e.device == g.device and e.dtype == g.dtype
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)
    assert torch.equal(eager_in["cache"], compiled_in["cache"])  # the mutation is kept


def test_compile_fullgraph_cpu():
    compiled_equals_eager("cpu", "aot_eager")


@cuda
def test_compile_fullgraph_cuda():
    compiled_equals_eager("cuda", "inductor")


@cuda
def test_cuda_ops_equal_cpu_ops_and_run_on_the_current_stream():
    host = step_inputs()
    dev = step_inputs("cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        ops.encode_kv(dev["cache"], BLOCK, dev["keys"], dev["key_slots"])
        out, lse = ops.sparse_attention(dev["q"], dev["cache"], BLOCK, dev["rows"], dev["lens"],
                                        sinks=dev["sinks"])
        back = ops.decode_kv(dev["cache"], BLOCK, dev["key_slots"])
        indptr, flat = ops.to_ragged(dev["rows"], dev["lens"])
    side.synchronize()
    host_indptr, host_flat = ops.to_ragged(host["rows"], host["lens"])
    assert torch.equal(indptr.cpu(), host_indptr) and torch.equal(flat.cpu(), host_flat)
    ops.encode_kv(host["cache"], BLOCK, host["keys"], host["key_slots"])
    assert torch.equal(dev["cache"].cpu(), host["cache"])  # the codec is bitwise
    assert torch.equal(back.cpu(), ops.decode_kv(host["cache"], BLOCK, host["key_slots"]))
    ref_out, ref_lse = ops.sparse_attention(host["q"], host["cache"], BLOCK, host["rows"],
                                            host["lens"], sinks=host["sinks"])
    torch.testing.assert_close(out.cpu().float(), ref_out.float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse.cpu(), ref_lse, atol=1e-3, rtol=1e-4)


@cuda
def test_attention_out_op_hands_its_workspace_to_the_kernels():
    # 300 tokens x 64 heads over 20 keys: a prefill-sized call that names each key many times, so
    # a workspace of the size asked holds decoded keys (docs/design.md#decoded-keys).
    s = step_inputs("cuda", tokens=300, heads=64, width=16)
    ops.encode_kv(s["cache"], BLOCK, s["keys"], s["key_slots"])
    args = (s["q"], s["cache"], BLOCK, s["rows"], s["lens"])
    n = sparse_swa.sparse_attention_workspace_bytes(*args)
    workspace = torch.full((max(n, 16),), 0xFF, dtype=torch.uint8, device="cuda")
    want_out, want_lse = sparse_swa.sparse_attention(*args, None, s["sinks"], workspace=workspace)
    out = torch.full_like(want_out, float("nan"))
    lse = torch.full_like(want_lse, float("nan"))
    workspace.fill_(0xFF)
    ops.sparse_attention_out(*args, out, lse, sinks=s["sinks"], workspace=workspace)
    torch.cuda.synchronize()
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)
    if n > 0:  # the kernels wrote into the caller's workspace
        assert not torch.all(workspace == 0xFF)


def decode_batch(rng, builder_cfg, num_reqs, pages):
    """A decode batch (1 token per request) as host arrays."""
    block = builder_cfg["block_size"]
    seq = rng.integers(1, pages.shape[1] * block, num_reqs).astype(np.int32)
    qsl = np.arange(num_reqs + 1, dtype=np.int32)
    pos = seq - 1
    slots = (pages[np.arange(num_reqs), pos // block].astype(np.int64) * block + pos % block)
    return qsl, seq, slots


@cuda
def test_cuda_graph_capture_of_build_and_attention_replays_like_eager():
    rng = np.random.default_rng(4)
    cfg = {"window_size": 128, "block_size": BLOCK, "max_num_batched_tokens": 64,
           "max_num_seqs": 16, "max_model_len": 1024}
    reqs, heads, blocks = 16, 16, 1024 // BLOCK
    pages = rng.permutation(reqs * blocks).reshape(reqs, blocks).astype(np.int32)
    page_bytes = sparse_swa.page_layout(BLOCK)["page_bytes"]
    cache = torch.zeros((reqs * blocks, page_bytes), dtype=torch.uint8, device="cuda")
    all_slots = torch.arange(reqs * blocks * BLOCK, dtype=torch.int64, device="cuda")
    ops.encode_kv(cache, BLOCK, torch.randn((len(all_slots), 512), device="cuda"), all_slots)

    qsl, seq, slots = decode_batch(rng, cfg, reqs, pages)
    # Static inputs: device tensors and their host copies, updated in place between replays (a
    # replay runs the captured kernels on the device arrays; the host copies give the split).
    d_qsl, d_seq = torch.from_numpy(qsl).cuda(), torch.from_numpy(seq).cuda()
    d_bt, d_slots = torch.from_numpy(pages).cuda(), torch.from_numpy(slots).cuda()
    h_qsl, h_seq = torch.from_numpy(qsl.copy()), torch.from_numpy(seq.copy())
    q = torch.randn((reqs, heads, 512), device="cuda").to(torch.bfloat16)
    sinks = torch.randn(heads, device="cuda")
    out = torch.empty_like(q)
    lse = torch.empty((reqs, heads), dtype=torch.float32, device="cuda")

    builder = sparse_swa.MetadataBuilder(cfg, device="cuda")

    def step():
        md = builder.build(d_qsl, d_seq, d_bt, d_slots, query_start_loc_cpu=h_qsl,
                           seq_lens_cpu=h_seq)
        ops.sparse_attention_out(q, cache, BLOCK, md.decode_swa_indices, md.decode_swa_lens,
                                 out, lse, sinks=sinks)
        return md

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture, as torch.cuda.graph asks
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        md = step()

    eager_builder = sparse_swa.MetadataBuilder(cfg, device="cuda")
    for _ in range(3):
        # The next step: every request one token longer (same shapes), new queries.
        seq = seq + 1
        seq = np.minimum(seq, blocks * BLOCK)
        pos = seq - 1
        slots = pages[np.arange(reqs), pos // BLOCK].astype(np.int64) * BLOCK + pos % BLOCK
        d_seq.copy_(torch.from_numpy(seq))
        h_seq.copy_(torch.from_numpy(seq))
        d_slots.copy_(torch.from_numpy(slots))
        q.copy_(torch.randn_like(q, dtype=torch.float32).to(torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        ref = eager_builder.build(torch.from_numpy(qsl).cuda(), torch.from_numpy(seq).cuda(),
                                  d_bt.clone(), torch.from_numpy(slots).cuda(),
                                  query_start_loc_cpu=torch.from_numpy(qsl),
                                  seq_lens_cpu=torch.from_numpy(seq))
        ref_out, ref_lse = ops.sparse_attention(q, cache, BLOCK, ref.decode_swa_indices,
                                                ref.decode_swa_lens, sinks=sinks)
        torch.cuda.synchronize()
        assert torch.equal(md.decode_swa_indices, ref.decode_swa_indices)
        assert torch.equal(md.decode_swa_lens, ref.decode_swa_lens)
        assert torch.equal(md.decode_swa_lens.cpu(), torch.from_numpy(np.minimum(seq, 128)))
        torch.testing.assert_close(out.float(), ref_out.float(), atol=1e-2, rtol=1e-2)
        torch.testing.assert_close(lse, ref_lse, atol=1e-4, rtol=1e-5)
