# SPDX-License-Identifier: Apache-2.0
"""Device paths of every operation (`scripts/gpu/check.sh python`): torch CUDA tensors in, the
CUDA backend, results equal to the CPU path (bit for bit for integers and the codec, within the
attention tolerance for floats), the stream rules and the argument checks. The GPU tests skip
without torch or a CUDA device; the argument checks that must fail before any device memory is
touched also run here with fake CUDA arrays (fake_dlpack.py)."""

import random

import numpy as np
import pytest

import sparse_swa
from fake_dlpack import FakeCudaArray
from test_random_batches import random_batch, random_config

BLOCK = 64


# ---------------------------------------------------------------------------------------------
# Argument checks with fake CUDA arrays: ValueError naming the argument, before any launch.

def fake_attention_args(tokens=2, heads=4, width=8):
    return dict(q=FakeCudaArray([tokens, heads, 512], "bfloat16"),
                swa_cache=FakeCudaArray([4, 37440], "uint8"), swa_block_size=BLOCK,
                indices=FakeCudaArray([tokens, 1, width]), lens=FakeCudaArray([tokens]))


@pytest.mark.parametrize("name,bad,message", [
    ("indices", np.zeros((2, 8), np.int32), r"^indices: expected device cuda:0 like q, got cpu"),
    ("lens", FakeCudaArray([2], device_id=1), r"^lens: expected device cuda:0 like q, got cuda:1"),
    ("lens", FakeCudaArray([2], "int64"), r"^lens: expected dtype int32, got int64"),
    ("q", FakeCudaArray([2, 4, 512], "float32"), r"^q: expected dtype bfloat16 or uint16, got "
                                                 r"float32"),
    ("q", FakeCudaArray([2, 4, 512], "bfloat16", strides=[2048, 1, 4]),
     r"^q: expected C-contiguous rows"),
    ("indices", FakeCudaArray([2, 8], strides=[16, 2]),
     r"^indices: expected rows with unit column stride, got stride 2"),
    ("indices", FakeCudaArray([3, 8]), r"^indices: expected 2 rows \(the tokens of q\), got 3"),
    ("swa_cache", FakeCudaArray([4, 100], "uint8"), r"^swa_cache: expected >= 37376 columns"),
])
def test_fake_device_arguments_are_checked(name, bad, message):
    args = fake_attention_args()
    args[name] = bad
    with pytest.raises(ValueError, match=message):
        sparse_swa.sparse_attention(**args)


def test_fake_device_outputs_and_stream_are_checked():
    args = fake_attention_args()
    with pytest.raises(ValueError, match=r"^out: expected a contiguous \[2, 4, 512\]"):
        sparse_swa.sparse_attention(**args, out=FakeCudaArray([2, 8, 512], "bfloat16"))
    with pytest.raises(ValueError, match=r"^lse: expected dtype float32, got int32"):
        sparse_swa.sparse_attention(**args, out=FakeCudaArray([2, 4, 512], "bfloat16"),
                                    lse=FakeCudaArray([2, 4]))
    with pytest.raises(ValueError, match=r"^extra_indices: required with the other extra_\*"):
        sparse_swa.sparse_attention(**args, extra_cache=FakeCudaArray([4, 37440], "uint8"))
    # A DLPack producer that is neither torch nor cupy cannot have device outputs made for it.
    with pytest.raises(ValueError, match=r"^out: required for device arrays that are not torch"):
        sparse_swa.sparse_attention(**args)
    with pytest.raises(ValueError, match=r"^stream: expected None, an int \(a cudaStream_t\)"):
        sparse_swa.sparse_attention(**args, out=FakeCudaArray([2, 4, 512], "bfloat16"),
                                    lse=FakeCudaArray([2, 4], "float32"), stream="side")


def test_fake_device_codec_and_ragged_arguments_are_checked():
    cache = FakeCudaArray([4, 37440], "uint8")
    with pytest.raises(ValueError, match=r"^rows: expected device cuda:0 like cache, got cpu"):
        sparse_swa.encode_kv(cache, BLOCK, np.zeros((1, 512), np.float32),
                             FakeCudaArray([1], "int64"))
    with pytest.raises(ValueError, match=r"^rows: expected dtype float32 or bfloat16 or uint16"):
        sparse_swa.encode_kv(cache, BLOCK, FakeCudaArray([1, 512], "int32"),
                             FakeCudaArray([1], "int64"))
    with pytest.raises(ValueError, match=r"^slots: expected 2 entries \(the rows of rows\)"):
        sparse_swa.encode_kv(cache, BLOCK, FakeCudaArray([2, 512], "float32"),
                             FakeCudaArray([1], "int64"))
    with pytest.raises(ValueError, match=r"^out: expected shape \[3, 512\]"):
        sparse_swa.decode_kv(cache, BLOCK, FakeCudaArray([3], "int64"),
                             out=FakeCudaArray([2, 512], "float32"))
    with pytest.raises(ValueError, match=r"^lens: expected device cuda:0 like indices, got cpu"):
        sparse_swa.to_ragged(FakeCudaArray([2, 1, 8]), np.zeros(2, np.int32))


# ---------------------------------------------------------------------------------------------
# GPU: torch CUDA tensors against the CPU path.

try:
    import torch
except ImportError:
    torch = None
gpu = pytest.mark.skipif(
    torch is None or not torch.cuda.is_available() or not sparse_swa.cuda_available(),
    reason="needs torch, a CUDA GPU and sparse_swa's CUDA backend")


def bits_of(t):
    """A torch bf16 tensor's bit patterns as a host uint16 array."""
    return t.detach().cpu().view(torch.int16).numpy().view(np.uint16)


def random_cache(rng, num_blocks, block=BLOCK):
    """A cache of random rows in every slot: the SWA layout, or C128A's 2-entry pages."""
    layout = sparse_swa.page_layout(block) if block != 2 else sparse_swa.compressed_page_layout(
        256, 128)
    cache = np.zeros((num_blocks, layout["page_bytes"]), np.uint8)
    n = num_blocks * block
    rows = (rng.standard_normal((n, 512)) * rng.uniform(0.1, 4, (n, 1))).astype(np.float32)
    sparse_swa.encode_kv(cache, block, rows, np.arange(n, dtype=np.int64))
    return cache


def random_indices(rng, tokens, width, num_slots):
    idx = np.full((tokens, 1, width), -1, np.int32)
    lens = rng.integers(0, width + 1, tokens).astype(np.int32)
    for t in range(tokens):
        row = rng.choice(num_slots, width, replace=False).astype(np.int32)
        row[rng.random(width) < 0.1] = -1  # holes inside the length are skipped
        idx[t, 0, : lens[t]] = row[: lens[t]]
    return idx, lens


def weighted_abs_v(q_bits, segments, scale, sinks):
    """Per output element [T, H, 512]: the softmax-weighted mean of |V| over the token's keys (sink
    included), the scale of the error the pair kernels' bf16 P adds (docs/design.md#attention-
    precision). segments: (cache, block, indices [T, W], lens [T]) each."""
    q = sparse_swa.from_bf16_bits(q_bits).astype(np.float64)
    tokens, heads, _ = q.shape
    out = np.zeros(q.shape)
    for t in range(tokens):
        slots = [int(s) for cache, block, idx, lens in segments for s in idx[t, : lens[t]]
                 if s >= 0]
        if not slots:
            continue
        keys = np.concatenate([sparse_swa.decode_kv(cache, block, np.array(
            [s for s in idx[t, : lens[t]] if s >= 0], np.int64)).astype(np.float64)
            for cache, block, idx, lens in segments if (idx[t, : lens[t]] >= 0).any()])
        score = scale * q[t] @ keys.T  # [H, n]
        m = score.max(axis=1, keepdims=True)
        w = np.exp(score - m)
        total = w.sum(axis=1)
        factor = 1.0 / total / (1.0 + np.exp(sinks - (m[:, 0] + np.log(total))))
        out[t] = (w @ np.abs(keys)) * factor[:, None]
    return out


def assert_attention_close(out_bits, lse, ref_bits, ref_lse, abs_v):
    got = sparse_swa.from_bf16_bits(out_bits).astype(np.float64)
    ref = sparse_swa.from_bf16_bits(ref_bits).astype(np.float64)
    # bf16 output: the fp32 and the double accumulation may round to neighbouring values; the
    # pair kernels' bf16 P adds up to 2^-9 x the weighted mean of |V| (allowed twice over).
    assert np.all(np.abs(got - ref) <= 2**-7 * np.abs(ref) + 2**-8 * abs_v + 1e-3), (
        np.abs(got - ref) - 2**-7 * np.abs(ref) - 2**-8 * abs_v).max()
    assert np.array_equal(np.isinf(lse), np.isinf(ref_lse))
    finite = np.isfinite(ref_lse)
    np.testing.assert_allclose(lse[finite], ref_lse[finite], rtol=1e-5, atol=1e-3)


@gpu
@pytest.mark.parametrize("heads,tokens,extra", [(64, 3, True), (16, 5, False), (128, 2, True),
                                                (64, 40, False)])
def test_attention_on_device_matches_the_cpu_path(heads, tokens, extra):
    rng = np.random.default_rng(heads * 100 + tokens)
    swa = random_cache(rng, 4)
    idx, lens = random_indices(rng, tokens, 128, 4 * BLOCK)
    q = rng.standard_normal((tokens, heads, 512)).astype(np.float32)
    q_bits = sparse_swa.to_bf16_bits(q)
    sinks = rng.standard_normal(heads).astype(np.float32)
    kw_host, kw_dev = {}, {}
    if extra:
        comp = random_cache(rng, 64, block=2)
        eidx, elens = random_indices(rng, tokens, 64, 128)
        kw_host = dict(extra_cache=comp, extra_block_size=2, extra_indices=eidx[:, 0, :],
                       extra_lens=elens)
        kw_dev = {k: (torch.from_numpy(np.ascontiguousarray(v)).cuda()
                      if isinstance(v, np.ndarray) else v) for k, v in kw_host.items()}
    ref_out, ref_lse = sparse_swa.sparse_attention(q_bits, swa, BLOCK, idx, lens, 0.05, sinks,
                                                   **kw_host)
    dq = torch.from_numpy(q).cuda().to(torch.bfloat16)
    assert np.array_equal(bits_of(dq), q_bits)  # torch rounds as to_bf16_bits does
    out, lse = sparse_swa.sparse_attention(
        dq, torch.from_numpy(swa).cuda(), BLOCK, torch.from_numpy(idx).cuda(),
        torch.from_numpy(lens).cuda(), 0.05, torch.from_numpy(sinks).cuda(), **kw_dev)
    assert out.dtype == torch.bfloat16 and out.is_cuda and lse.is_cuda
    torch.cuda.synchronize()
    segments = [(swa, BLOCK, idx[:, 0, :], lens)]
    if extra:
        segments.append((comp, 2, eidx[:, 0, :], elens))
    abs_v = weighted_abs_v(q_bits, segments, 0.05, sinks)
    assert_attention_close(bits_of(out), lse.cpu().numpy(), ref_out, ref_lse, abs_v)
    # Each tensor-core kernel forced (sm_90 devices run both; the bound covers either).
    sm90 = torch.cuda.get_device_capability() == (9, 0)
    for kernel in ("sm90_tile32", "sm90_pairs") if sm90 else ():
        k_out, k_lse = sparse_swa.sparse_attention(
            dq, torch.from_numpy(swa).cuda(), BLOCK, torch.from_numpy(idx).cuda(),
            torch.from_numpy(lens).cuda(), 0.05, torch.from_numpy(sinks).cuda(), kernel=kernel,
            **kw_dev)
        torch.cuda.synchronize()
        assert_attention_close(bits_of(k_out), k_lse.cpu().numpy(), ref_out, ref_lse, abs_v)
    # out= / lse= are written in place; uint16 bits in give uint16 bits out.
    o = torch.zeros_like(dq)
    l_ = torch.zeros((tokens, heads), dtype=torch.float32, device="cuda")
    got = sparse_swa.sparse_attention(
        dq, torch.from_numpy(swa).cuda(), BLOCK, torch.from_numpy(idx).cuda(),
        torch.from_numpy(lens).cuda(), 0.05, torch.from_numpy(sinks).cuda(), out=o, lse=l_,
        **kw_dev)
    assert got[0] is o and got[1] is l_
    torch.cuda.synchronize()
    assert np.array_equal(bits_of(o), bits_of(out))
    assert np.array_equal(l_.cpu().numpy(), lse.cpu().numpy())


@gpu
def test_a_callers_workspace_serves_a_prefill_batch_that_shares_its_keys():
    # 300 tokens x 64 heads over one fp8_ds_mla cache of 1024 slots, 128-entry rows: on an sm_90
    # device with <= 150 SMs the call decodes each slot once into a bf16 copy in the workspace,
    # 1 KB a slot (docs/design.md#decoded-keys). Through a caller's workspace of the size asked,
    # one too small and the module's own, the results match the CPU path.
    rng = np.random.default_rng(300)
    heads, tokens = 64, 300
    swa = random_cache(rng, 16)
    idx, lens = random_indices(rng, tokens, 128, 16 * BLOCK)
    q = rng.standard_normal((tokens, heads, 512)).astype(np.float32)
    q_bits = sparse_swa.to_bf16_bits(q)
    sinks = np.zeros(heads, np.float32) - 1e30
    ref_out, ref_lse = sparse_swa.sparse_attention(q_bits, swa, BLOCK, idx, lens, 0.05)
    abs_v = weighted_abs_v(q_bits, [(swa, BLOCK, idx[:, 0, :], lens)], 0.05, sinks)
    dq = torch.from_numpy(q).cuda().to(torch.bfloat16)
    args = (dq, torch.from_numpy(swa).cuda(), BLOCK, torch.from_numpy(idx).cuda(),
            torch.from_numpy(lens).cuda())
    n = sparse_swa.sparse_attention_workspace_bytes(*args)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    if torch.cuda.get_device_capability() == (9, 0) and tokens >= 2 * sms:
        assert n == 16 * BLOCK * 1024
    workspace = torch.full((max(n, 16),), 0xFF, dtype=torch.uint8, device="cuda")
    for ws in (workspace, workspace[:16], None):
        out, lse = sparse_swa.sparse_attention(*args, 0.05, workspace=ws)
        torch.cuda.synchronize()
        assert_attention_close(bits_of(out), lse.cpu().numpy(), ref_out, ref_lse, abs_v)
    with pytest.raises(ValueError, match="^workspace: .*16"):
        sparse_swa.sparse_attention(*args, 0.05, workspace=workspace[1:])
    with pytest.raises(ValueError, match="^workspace: expected device cuda:0 like q, got cpu"):
        sparse_swa.sparse_attention(*args, 0.05, workspace=np.zeros(64, np.uint8))


@gpu
def test_codec_on_device_is_bit_exact():
    rng = np.random.default_rng(11)
    layout = sparse_swa.page_layout(BLOCK)
    rows = (rng.standard_normal((50, 512)) * 3).astype(np.float32)
    slots = rng.permutation(2 * BLOCK)[:50].astype(np.int64)
    slots[3] = -1
    host = np.zeros((2, layout["page_bytes"]), np.uint8)
    sparse_swa.encode_kv(host, BLOCK, rows, slots)
    dev = torch.zeros((2, layout["page_bytes"]), dtype=torch.uint8, device="cuda")
    sparse_swa.encode_kv(dev, BLOCK, torch.from_numpy(rows).cuda(), torch.from_numpy(slots).cuda())
    torch.cuda.synchronize()
    assert np.array_equal(dev.cpu().numpy(), host)
    decoded = sparse_swa.decode_kv(dev, BLOCK, torch.from_numpy(slots).cuda())
    assert decoded.is_cuda and decoded.dtype == torch.float32
    assert np.array_equal(decoded.cpu().numpy(), sparse_swa.decode_kv(host, BLOCK, slots))
    # bf16 rows: the device codec equals the host codec on the same bits.
    b16 = torch.from_numpy(rows).cuda().to(torch.bfloat16)
    host16 = np.zeros_like(host)
    sparse_swa.encode_kv(host16, BLOCK, bits_of(b16), slots)
    dev.zero_()
    sparse_swa.encode_kv(dev, BLOCK, b16, torch.from_numpy(slots).cuda())
    torch.cuda.synchronize()
    assert np.array_equal(dev.cpu().numpy(), host16)


def device_batch(arrays):
    """The batch as torch CUDA tensors plus the two host copies, as build() arguments."""
    qsl, seq, bt, slots = (torch.from_numpy(np.ascontiguousarray(a)).cuda() for a in arrays)
    return (qsl, seq, bt, slots), dict(query_start_loc_cpu=torch.from_numpy(arrays[0]),
                                       seq_lens_cpu=torch.from_numpy(arrays[1].copy()))


def cuda_build(builder, arrays, **kw):
    args, host = device_batch(arrays)
    return builder.build(*args, **host, **kw)


@gpu
@pytest.mark.parametrize("seed", range(12))
def test_consumers_on_device_equal_the_cpu_path(seed):
    rng = random.Random(seed)
    config, theta = random_config(rng)
    arrays, causal = random_batch(rng, config, theta)
    cpu = sparse_swa.MetadataBuilder(config).build(*arrays, causal=causal)
    dev = cuda_build(sparse_swa.MetadataBuilder(config), arrays, causal=causal)
    for got, want in zip(dev.mixed_matrix(), cpu.mixed_matrix()):
        assert got.is_cuda
        assert np.array_equal(got.cpu().numpy(), want)
    for (gc, grows, glens), (cc, crows, clens) in zip(dev.combined_prefill(1, 4),
                                                      cpu.combined_prefill(1, 4)):
        assert gc == cc
        assert np.array_equal(grows.cpu().numpy(), crows)
        assert np.array_equal(glens.cpu().numpy(), clens)
    for name in ("decode_swa", "prefill_swa"):
        rows, lens = getattr(cpu, name + "_indices"), getattr(cpu, name + "_lens")
        if rows is None:
            continue
        indptr, flat = sparse_swa.to_ragged(getattr(dev, name + "_indices"),
                                            getattr(dev, name + "_lens"))
        want_indptr, want_flat = sparse_swa.to_ragged(rows, lens)
        got_indptr = indptr.cpu().numpy()
        assert np.array_equal(got_indptr, want_indptr)
        assert flat.shape[0] == rows.shape[0] * rows.shape[2]  # the capacity
        assert np.array_equal(flat.cpu().numpy()[: got_indptr[-1]], want_flat)


@gpu
def test_compressed_consumers_on_device_equal_the_cpu_path():
    from test_compressed_topk import CBT3, CONFIG, DECODE_LOCAL, PREFILL_LOCAL, compressed_step
    cpu = compressed_step()  # host metadata; its batch arrays again on the device:
    arrays = (cpu.query_start_loc, cpu.seq_lens, cpu.block_table, cpu.slot_mapping)
    dev = cuda_build(sparse_swa.MetadataBuilder(dict(CONFIG, max_model_len=64)),
                     tuple(np.array(a) for a in arrays))
    d = {name: torch.from_numpy(a).cuda() for name, a in
         (("cbt", CBT3), ("decode_local", DECODE_LOCAL), ("prefill_local", PREFILL_LOCAL))}
    got = dev.mixed_matrix(compress_ratio=4, block_table=d["cbt"], block_size=4,
                           decode_local=d["decode_local"], prefill_local=d["prefill_local"])
    want = cpu.mixed_matrix(compress_ratio=4, block_table=CBT3, block_size=4,
                            decode_local=DECODE_LOCAL, prefill_local=PREFILL_LOCAL)
    for g, w in zip(got, want):
        assert g.is_cuda and np.array_equal(g.cpu().numpy(), w)
    [(gc, grows, glens)] = dev.combined_prefill(4, 4, prefill_local=d["prefill_local"])
    [(wc, wrows, wlens)] = cpu.combined_prefill(4, 4, prefill_local=PREFILL_LOCAL)
    assert gc == wc and np.array_equal(grows.cpu().numpy(), wrows)
    assert np.array_equal(glens.cpu().numpy(), wlens)
    for g, w in zip(sparse_swa.compressed_topk_to_global(dev, 0, d["decode_local"], d["cbt"], 4, 4),
                    sparse_swa.compressed_topk_to_global(cpu, 0, DECODE_LOCAL, CBT3, 4, 4)):
        assert g.is_cuda and np.array_equal(g.cpu().numpy(), w)


SLEEP_CYCLES = 1_000_000_000  # about half a second on an H200: far longer than the op


@gpu
def test_codec_lands_on_the_given_side_stream():
    rng = np.random.default_rng(3)
    host = random_cache(rng, 1)
    slots = torch.arange(8, dtype=torch.int64, device="cuda")
    cache = torch.from_numpy(host).cuda()
    out = torch.zeros((8, 512), dtype=torch.float32, device="cuda")
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(SLEEP_CYCLES)
    sparse_swa.decode_kv(cache, BLOCK, slots, out=out, stream=side)
    # Read on the current stream before the side stream's sync: still the zeros.
    assert not side.query()
    assert not out.cpu().any()
    side.synchronize()
    assert np.array_equal(out.cpu().numpy(), sparse_swa.decode_kv(host, BLOCK, slots.cpu().numpy()))


@gpu
@pytest.mark.parametrize("how", ["argument", "current_stream", "int"])
def test_attention_lands_on_the_callers_stream(how):
    rng = np.random.default_rng(4)
    swa = torch.from_numpy(random_cache(rng, 2)).cuda()
    idx, lens = random_indices(rng, 4, 64, 2 * BLOCK)
    q = torch.randn((4, 64, 512), device="cuda").to(torch.bfloat16)
    args = (q, swa, BLOCK, torch.from_numpy(idx).cuda(), torch.from_numpy(lens).cuda())
    want_out, want_lse = sparse_swa.sparse_attention(*args)
    out = torch.zeros_like(q)
    lse = torch.zeros((4, 64), device="cuda")
    side = torch.cuda.Stream()
    # Once on the side stream first: its workspace is allocated now, not behind the sleep.
    sparse_swa.sparse_attention(*args, stream=side)
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(SLEEP_CYCLES)
        if how == "current_stream":  # stream=None: torch's current stream
            sparse_swa.sparse_attention(*args, out=out, lse=lse)
    if how == "argument":
        sparse_swa.sparse_attention(*args, out=out, lse=lse, stream=side)
    elif how == "int":
        sparse_swa.sparse_attention(*args, out=out, lse=lse, stream=side.cuda_stream)
    assert not side.query()
    assert not lse.cpu().any()
    side.synchronize()
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)


@gpu
def test_build_lands_on_the_callers_stream():
    config = {"window_size": 8, "block_size": 4, "max_num_batched_tokens": 64,
              "max_num_seqs": 8, "max_model_len": 64}
    builder = sparse_swa.MetadataBuilder(config)
    qsl = np.array([0, 1, 2], np.int32)
    bt = np.arange(16, dtype=np.int32).reshape(2, 8)

    def decode_step(seq_lens):  # one new token per request, written at its slot
        seq = np.array(seq_lens, np.int32)
        slots = np.array([bt[r, (s - 1) // 4] * 4 + (s - 1) % 4 for r, s in enumerate(seq)],
                         np.int64)
        return qsl, seq, bt, slots

    first = cuda_build(builder, decode_step([5, 9]))
    torch.cuda.synchronize()
    assert first.decode_swa_lens.cpu().tolist() == [5, 8]
    side = torch.cuda.Stream()
    args, host = device_batch(decode_step([3, 6]))
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(SLEEP_CYCLES)
    second = builder.build(*args, **host, stream=side)
    assert not side.query()
    assert second.decode_swa_lens.cpu().tolist() == [5, 8]  # the buffers still hold build 1
    side.synchronize()
    assert second.decode_swa_lens.cpu().tolist() == [3, 6]
    # stream=None on torch tensors: torch's current stream, whatever the builder was made with.
    # (The tensors are made first: a copy into them on the side stream would wait for the sleep.)
    args, host = device_batch(decode_step([2, 7]))
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(SLEEP_CYCLES)
        third = builder.build(*args, **host)
    assert not side.query()
    side.synchronize()
    assert third.decode_swa_lens.cpu().tolist() == [2, 7]


@gpu
def test_device_errors_name_the_argument():
    rng = np.random.default_rng(5)
    swa = torch.from_numpy(random_cache(rng, 1)).cuda()
    q = torch.zeros((2, 4, 512), dtype=torch.bfloat16, device="cuda")
    idx = torch.zeros((2, 1, 8), dtype=torch.int32, device="cuda")
    lens = torch.zeros(2, dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match=r"^indices: expected device cuda:0 like q, got cpu"):
        sparse_swa.sparse_attention(q, swa, BLOCK, idx.cpu(), lens)
    with pytest.raises(ValueError, match=r"^q: expected dtype bfloat16 or uint16, got float32"):
        sparse_swa.sparse_attention(q.float(), swa, BLOCK, idx, lens)
    with pytest.raises(ValueError, match=r"^q: expected C-contiguous rows"):
        sparse_swa.sparse_attention(q.transpose(0, 1).contiguous().transpose(0, 1), swa, BLOCK,
                                    idx, lens)
    with pytest.raises(ValueError, match=r"^indices: expected rows with unit column stride"):
        wide = torch.zeros((2, 16), dtype=torch.int32, device="cuda")
        sparse_swa.sparse_attention(q, swa, BLOCK, wide[:, ::2], lens)
    with pytest.raises(ValueError, match=r"^lens: expected 2 entries"):
        sparse_swa.sparse_attention(q, swa, BLOCK, idx, lens[:1])
    with pytest.raises(ValueError, match=r"^out: expected dtype bfloat16 or uint16, got float32"):
        sparse_swa.sparse_attention(q, swa, BLOCK, idx, lens, out=torch.zeros(2, 4, 512,
                                                                              device="cuda"))
    with pytest.raises(ValueError, match=r"^slots: expected device cuda:0 like cache, got cpu"):
        sparse_swa.decode_kv(swa, BLOCK, torch.zeros(1, dtype=torch.int64))
