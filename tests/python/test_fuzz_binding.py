# SPDX-License-Identifier: Apache-2.0
"""Property-based fuzzing of every public function of the binding (Hypothesis): random dtypes,
shapes, strides (sliced, transposed, negative, misaligned, read-only), devices (fake CUDA
arrays on a machine without one, host arrays whose size overflows int64), None, scalars and
lifetimes (inputs dropped, metadata made stale by a later build, the builder collected). The
only acceptable outcomes are a result or ValueError / NotImplementedError / RuntimeError with a
message of ours (no C++ text, never TypeError or a crash).

CI runs SPARSE_SWA_FUZZ_EXAMPLES (default 200) derandomized examples per test; a longer random
run: SPARSE_SWA_FUZZ_EXAMPLES=20000 SPARSE_SWA_FUZZ_RANDOM=1 pytest tests/python/test_fuzz_binding.py
"""

import gc
import os
import random

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, event, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import sparse_swa  # noqa: E402
from fake_dlpack import FakeCudaArray, FakeHostArray  # noqa: E402
from test_random_batches import random_batch, random_config  # noqa: E402

EXAMPLES = int(os.environ.get("SPARSE_SWA_FUZZ_EXAMPLES", "200"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=os.environ.get("SPARSE_SWA_FUZZ_RANDOM") != "1",
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.filter_too_much],
)

ALLOWED = (ValueError, NotImplementedError, RuntimeError)
CPP_TEXT = ("std::", "basic_string", "bad_cast", "bad_alloc", "incompatible function arguments",
            "nanobind", "what()")
NO_DEVICE = not sparse_swa.cuda_available()


def outcome(call):
    """Runs `call`; a result, or an allowed exception with a message of ours."""
    try:
        result = call()
        event("result")  # --hypothesis-show-statistics counts how often each outcome occurs
        return result
    except ALLOWED as e:
        event(type(e).__name__)
        message = str(e)
        assert message, f"{type(e).__name__} without a message"
        for text in CPP_TEXT:
            assert text not in message, f"C++ text in {type(e).__name__}: {message}"
        return e


# --------------------------------------------------------------------------- strategies

DTYPES = [np.int32, np.int64, np.uint8, np.uint16, np.float32, np.float64, np.bool_, np.int8,
          np.int16, np.uint32, np.complex64]


def int_values():
    return st.one_of(st.integers(-3, 70), st.integers(-(2**31), 2**31 - 1),
                     st.sampled_from([2**31, -(2**31) - 1, 2**63 - 1, -(2**63), 2**70]))


@st.composite
def host_array(draw, dtype=None, ndim=None, max_dim=5):
    """A numpy array of any layout; `dtype` / `ndim` bias it toward what a parameter takes."""
    dt = np.dtype(dtype if dtype is not None and draw(st.integers(0, 9)) else
                  draw(st.sampled_from(DTYPES)))
    nd = ndim if ndim is not None and draw(st.integers(0, 9)) else draw(st.integers(0, 3))
    shape = tuple(draw(st.integers(0, max_dim)) for _ in range(nd))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if dt.kind in "iu":
        info = np.iinfo(dt)
        small = rng.integers(max(info.min, -3), min(info.max, 70), size=shape, endpoint=True)
        wide = rng.integers(info.min, info.max, size=shape, endpoint=True, dtype=dt)
        a = np.where(rng.random(shape) < 0.9, small, wide).astype(dt)
    elif dt.kind == "f":
        a = rng.normal(0, 4, size=shape).astype(dt)
        a[rng.random(shape) < 0.05] = np.nan
        a[rng.random(shape) < 0.05] = np.inf
    elif dt.kind == "c":
        a = (rng.normal(size=shape) + 1j).astype(dt)
    else:
        a = rng.random(shape) < 0.5
    layout = draw(st.sampled_from(["c", "c", "c", "strided", "transposed", "negative",
                                   "misaligned", "readonly", "zero_d"]))
    if layout == "strided" and a.ndim:
        big = np.repeat(a, 2, axis=a.ndim - 1) if draw(st.booleans()) else np.repeat(a, 2, axis=0)
        a = big[..., ::2] if draw(st.booleans()) else big[::2]
    elif layout == "transposed" and a.ndim >= 2:
        a = a.T
    elif layout == "negative" and a.ndim:
        a = a[::-1]
    elif layout == "misaligned" and a.size and dt.itemsize > 1:
        raw = np.zeros(a.nbytes + 1, np.uint8)
        a = np.frombuffer(raw.data, dtype=dt, count=a.size, offset=1).reshape(a.shape)
    elif layout == "readonly":
        a = a.copy()
        a.setflags(write=False)
    elif layout == "zero_d":
        a = np.array(a.flat[0] if a.size else 0, dtype=dt)
    return a


def fake_array(shape_dtype):
    shape, dtype = shape_dtype
    return FakeCudaArray(shape, dtype)


def junk():
    """Anything but a suitable array: None, scalars of every kind, containers, fakes."""
    fakes = [st.builds(lambda s: FakeHostArray(s), st.sampled_from([[2**40, 2**40], [2**62],
                                                                     [3, 2**62, 2**62]]))]
    if NO_DEVICE:  # a fake CUDA array must be rejected before its (bogus) memory is used
        fakes.append(st.builds(fake_array, st.tuples(
            st.lists(st.integers(0, 4), min_size=1, max_size=2),
            st.sampled_from(["int32", "int64", "uint8", "float32"]))))
    return st.one_of(
        st.none(), st.booleans(), int_values(), st.floats(allow_nan=True),
        st.text(max_size=6), st.binary(max_size=6), st.lists(st.integers(-2, 9), max_size=4),
        st.builds(np.int32, st.integers(-(2**31), 2**31 - 1)), st.builds(np.float64, st.floats()),
        st.dictionaries(st.integers(-1, 4), st.lists(st.tuples(st.integers(-1, 9),
                                                                st.integers(-1, 9)), max_size=2),
                        max_size=2),
        *fakes)


def arg(array_strategy):
    """Mostly a (possibly odd) array, sometimes anything else."""
    return st.one_of(array_strategy, array_strategy, array_strategy, junk())


def scalar(valid):
    """Mostly a plausible value, sometimes junk."""
    return st.one_of(valid, valid, junk())


DTYPE_NAMES = st.sampled_from(["fp8_ds_mla", "bf16", "fp8_e4m3"])


# --------------------------------------------------------------------------- KV cache, attention


@FUZZ
@given(valid=st.sampled_from([(32, "fp8_ds_mla", "flashmla"), (64, "bf16", "flashinfer"),
                              (256, "fp8_e4m3", "flashinfer")]),
       which=st.sampled_from(["none", "block_size", "dtype", "consumer"]),
       value=st.one_of(st.sampled_from([0, -32, 48, 2**31, "flashmla", "bf16"]), junk()))
def test_page_layout(valid, which, value):
    args = dict(zip(["block_size", "dtype", "consumer"], valid))
    if which != "none":
        args[which] = value
    r = outcome(lambda: sparse_swa.page_layout(**args))
    if isinstance(r, dict):
        assert r["page_bytes"] >= r["content_bytes"] > 0 and r["page_bytes"] % r["alignment"] == 0


@st.composite
def kv_call(draw):
    """Coherent arguments of encode_kv / decode_kv / sparse_attention (a cache of small pages,
    n rows and slots, T tokens x H heads with index rows into the cache), then at most one of
    them replaced by a fuzzed value: the name of the replaced one, and the arguments."""
    block_size = draw(st.integers(1, 3))
    dtype = draw(DTYPE_NAMES)
    token = {"fp8_ds_mla": 584, "bf16": 1024, "fp8_e4m3": 512}[dtype]
    num_blocks = draw(st.integers(0, 3))
    cols = (block_size * token + 15) // 16 * 16 + 16 * draw(st.integers(0, 1))
    num_slots = num_blocks * block_size
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    cache = rng.integers(0, 255, size=(num_blocks, cols), dtype=np.uint8)
    n = draw(st.integers(0, 4))
    rows = rng.normal(0, 2, size=(n, 512)).astype(np.float32)
    slots = rng.integers(-1, max(num_slots, 0), size=n, endpoint=False).astype(np.int64)
    tokens, heads, width = draw(st.integers(0, 3)), draw(st.integers(1, 4)), draw(st.integers(0, 6))
    q = rng.integers(0, 2**16, size=(tokens, heads, 512), dtype=np.uint16) & 0xBFFF  # finite-ish
    indices = rng.integers(-1, max(num_slots, 0), size=(tokens, width), endpoint=False)
    args = dict(cache=cache, block_size=block_size, dtype=dtype, rows=rows, slots=slots, q=q,
                indices=indices.astype(np.int32),
                lens=rng.integers(0, width, size=tokens, endpoint=True).astype(np.int32),
                scale=None, sinks=rng.normal(size=heads).astype(np.float32)
                if draw(st.booleans()) else None)
    which = draw(st.sampled_from(["none", "none", *args]))
    fuzzed = {"cache": arg(host_array(np.uint8, 2)), "rows": arg(host_array(np.float32, 2)),
              "slots": arg(host_array(np.int64, 1)), "q": arg(host_array(np.uint16, 3)),
              "indices": arg(host_array(np.int32, 2)), "lens": arg(host_array(np.int32, 1)),
              "sinks": st.one_of(st.none(), arg(host_array(np.float32, 1))),
              "block_size": junk(), "dtype": junk(),
              "scale": st.one_of(st.floats(allow_nan=True), junk())}
    if which != "none":
        args[which] = draw(fuzzed[which])
    return which, args


@FUZZ
@given(call=kv_call())
def test_encode_and_decode_kv(call):
    which, a = call
    before = a["cache"].copy() if isinstance(a["cache"], np.ndarray) else None
    r = outcome(lambda: sparse_swa.encode_kv(a["cache"], a["block_size"], a["rows"], a["slots"],
                                             a["dtype"]))
    if isinstance(r, Exception) and before is not None:
        assert np.array_equal(before, a["cache"]), "encode_kv wrote the cache before failing"
    r = outcome(lambda: sparse_swa.decode_kv(a["cache"], a["block_size"], a["slots"], a["dtype"]))
    if isinstance(r, np.ndarray):
        assert r.dtype == np.float32 and r.shape == (len(a["slots"]), 512)
        assert not r[np.asarray(a["slots"]) == -1].any()  # slot -1 reads zeros


@FUZZ
@given(call=kv_call())
def test_sparse_attention(call):
    which, a = call
    r = outcome(lambda: sparse_swa.sparse_attention(a["q"], a["cache"], a["block_size"],
                                                    a["indices"], a["lens"], a["scale"],
                                                    a["sinks"], a["dtype"]))
    if isinstance(r, tuple):
        out, lse = r
        assert out.shape == a["q"].shape and lse.shape == a["q"].shape[:2]
        empty = np.asarray(a["lens"]) == 0
        assert np.isinf(lse[empty]).all() and not out[empty].any()  # no keys: +inf and zeros


@st.composite
def ragged_call(draw):
    rows, width = draw(st.integers(0, 5)), draw(st.integers(0, 6))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    indices = rng.integers(-1, 50, size=(rows, width)).astype(np.int32)
    lens = rng.integers(0, width, size=rows, endpoint=True).astype(np.int32)
    which = draw(st.sampled_from(["none", "indices", "lens"]))
    if which == "indices":
        indices = draw(arg(host_array(np.int32, 2)))
    elif which == "lens":
        lens = draw(arg(host_array(np.int32, 1)))
    return indices, lens


@FUZZ
@given(call=ragged_call())
def test_to_ragged(call):
    indices, lens = call
    r = outcome(lambda: sparse_swa.to_ragged(indices, lens))
    if isinstance(r, tuple):
        indptr, flat = r
        assert indptr[0] == 0 and indptr[-1] == len(flat)
        for i in range(len(indptr) - 1):
            assert flat[indptr[i]:indptr[i + 1]].tolist() == indices[i, :lens[i]].tolist()


# --------------------------------------------------------------------------- config and builder

CONFIG_KEYS = ["window_size", "block_size", "max_num_batched_tokens", "max_num_seqs",
               "max_model_len", "num_speculative_tokens", "speculative_method",
               "parallel_drafting", "max_image_tokens", "compress_ratios",
               "noncausal_index_width", "unknown_key"]


@FUZZ
@given(seed=st.integers(0, 2**32 - 1),
       changes=st.dictionaries(st.sampled_from(CONFIG_KEYS), junk(), max_size=3),
       device=scalar(st.sampled_from([None, "cpu", "cuda", "cuda:1", "tpu"])))
def test_builder_config_and_constructor(seed, changes, device):
    config, _ = random_config(random.Random(seed))
    config.update(changes)
    c = outcome(lambda: sparse_swa.BuilderConfig.from_dict(config))
    if isinstance(c, sparse_swa.BuilderConfig):
        assert outcome(c.to_dict) is not None
    for key, value in changes.items():
        if hasattr(sparse_swa.BuilderConfig(), key):  # the setters (unknown names: AttributeError)
            outcome(lambda: setattr(sparse_swa.BuilderConfig(), key, value))
    b = outcome(lambda: sparse_swa.MetadataBuilder(config, device=device))
    if isinstance(b, sparse_swa.MetadataBuilder):
        for name in ["config", "decode_threshold", "prefill_index_width", "noncausal_index_width",
                     "layer_types", "cuda_stream", "backends"]:
            outcome(lambda: getattr(b, name))


MUTATIONS = ["none", "query_start_loc", "seq_lens", "block_table", "slot_mapping", "causal",
             "image_spans", "query_start_loc_cpu", "seq_lens_cpu"]


@st.composite
def mutated_step(draw):
    """A valid random step, then one argument replaced by a fuzzed value."""
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    config, theta = random_config(rng)
    (qsl, seq, bt, slots), causal = random_batch(rng, config, theta)
    kwargs = dict(query_start_loc=qsl, seq_lens=seq, block_table=bt, slot_mapping=slots,
                  causal=causal)
    which = draw(st.sampled_from(MUTATIONS))
    if which in ("query_start_loc", "seq_lens", "query_start_loc_cpu", "seq_lens_cpu"):
        kwargs[which] = draw(arg(host_array(np.int32, 1)))
    elif which == "block_table":
        kwargs[which] = draw(arg(host_array(np.int32, 2)))
    elif which == "slot_mapping":
        kwargs[which] = draw(arg(host_array(np.int64, 1)))
    elif which == "causal":
        kwargs[which] = draw(junk())
    elif which == "image_spans":
        kwargs[which] = draw(junk())
    return config, kwargs


@FUZZ
@given(step=mutated_step(), later=mutated_step(),
       ratio=scalar(st.sampled_from([1, 2, 4, 128, 3])),
       chunk=scalar(st.sampled_from([1, 4, 2**62, 0, -1])),
       has_compressed=st.one_of(st.none(), scalar(st.booleans())),
       lifetime=st.sampled_from(["keep", "drop_inputs", "stale", "drop_builder"]),
       update=st.sampled_from(["none", "metadata", "rows"]),
       update_args=mutated_step())
def test_build_consumers_and_lifetimes(step, later, ratio, chunk, has_compressed, lifetime,
                                       update, update_args):
    config, kwargs = step
    builder = outcome(lambda: sparse_swa.MetadataBuilder(config))
    if not isinstance(builder, sparse_swa.MetadataBuilder):
        return
    md = outcome(lambda: builder.build(**kwargs))
    if not isinstance(md, sparse_swa.SwaMetadata):
        return
    if lifetime == "drop_inputs":
        kwargs.clear()
        gc.collect()
    elif lifetime == "stale":  # a later build (valid or not) of the same builder
        outcome(lambda: builder.build(**later[1]))
    elif lifetime == "drop_builder":
        builder = None
        gc.collect()
    for name in ["decode_swa_indices", "decode_swa_lens", "prefill_swa_indices",
                 "prefill_gather_lens", "token_to_req_indices", "is_valid_token",
                 "slot_mapping", "tile_schedulers", "is_current", "num_tokens"]:
        outcome(lambda: getattr(md, name))
    outcome(lambda: md.get_prefill_chunk_plan(ratio, chunk, has_compressed))
    outcome(md.copy)
    outcome(md.mixed_matrix)
    outcome(lambda: md.combined_prefill(ratio, chunk))
    if builder is not None and update == "metadata":
        u = update_args[1]
        outcome(lambda: builder.update_draft_decode_metadata(
            md, seq_lens=u["seq_lens"], block_table=u["block_table"]))
    elif builder is not None and update == "rows":
        u = update_args[1]
        outcome(lambda: builder.update_draft_decode_rows(
            md, u["query_start_loc"], u["seq_lens"], u["block_table"], u["slot_mapping"]))
    if md.is_current:
        outcome(md.mixed_matrix)


# --------------------------------------------------------------------------- device-path arguments


@FUZZ
@given(call=kv_call(), which=st.sampled_from(["none", "extra_cache", "extra_indices",
                                              "extra_lens", "extra_block_size", "out", "lse",
                                              "stream"]),
       value=st.one_of(junk(), arg(host_array(np.uint16, 3)), arg(host_array(np.float32, 2))))
def test_sparse_attention_extra_segment_outputs_and_stream(call, which, value):
    _, a = call
    kw = dict(extra_cache=a["cache"], extra_block_size=a["block_size"],
              extra_indices=a["indices"], extra_lens=a["lens"])
    if isinstance(a["q"], np.ndarray) and a["q"].ndim == 3:
        kw["out"] = np.zeros_like(a["q"]) if a["q"].dtype == np.uint16 else None
        kw["lse"] = np.zeros(a["q"].shape[:2], np.float32)
    if which != "none":
        kw[which] = value
    r = outcome(lambda: sparse_swa.sparse_attention(a["q"], a["cache"], a["block_size"],
                                                    a["indices"], a["lens"], a["scale"],
                                                    a["sinks"], a["dtype"], **kw))
    if isinstance(r, tuple):  # outputs given are the outputs returned
        assert kw.get("out") is None or r[0] is kw["out"]
        assert kw.get("lse") is None or r[1] is kw["lse"]


@st.composite
def topk_call(draw):
    """A valid host build with compressed layers, coherent compressed_topk_to_global arguments,
    then at most one replaced by a fuzzed value."""
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    config, theta = random_config(rng)
    config["compress_ratios"] = [1, 4]
    (qsl, seq, bt, slots), causal = random_batch(rng, config, theta)
    nprng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    first = draw(st.integers(0, 3))
    n = max(0, len(slots) - first)
    topk = draw(st.integers(0, 6))
    args = dict(first_token=first, local=nprng.integers(-2, 20, size=(n, topk)).astype(np.int32),
                block_table=nprng.integers(-1, 50, size=(8, 5)).astype(np.int32),
                block_size=draw(st.integers(0, 4)), compress_ratio=draw(st.sampled_from([4, 2,
                                                                                           1])),
                out=None, out_lens=None)
    which = draw(st.sampled_from(["none", *args]))
    if which in ("local", "block_table", "out"):
        args[which] = draw(arg(host_array(np.int32, 2)))
    elif which == "out_lens":
        args[which] = draw(arg(host_array(np.int32, 1)))
    elif which != "none":
        args[which] = draw(scalar(int_values()))
    return config, (qsl, seq, bt, slots, causal), args


@FUZZ
@given(call=topk_call())
def test_compressed_topk_mixed_matrix_and_prefill(call):
    config, (qsl, seq, bt, slots, causal), a = call
    builder = outcome(lambda: sparse_swa.MetadataBuilder(config))
    if not isinstance(builder, sparse_swa.MetadataBuilder):
        return
    md = outcome(lambda: builder.build(qsl, seq, bt, slots, causal=causal))
    if not isinstance(md, sparse_swa.SwaMetadata):
        return
    # The compressed layer's mixed matrix and prefill rows take the same (fuzzed) arguments.
    outcome(lambda: md.mixed_matrix(compress_ratio=a["compress_ratio"],
                                    block_table=a["block_table"], block_size=a["block_size"],
                                    decode_local=a["local"], prefill_local=a["local"]))
    outcome(lambda: md.combined_prefill(a["compress_ratio"], 4, prefill_local=a["local"]))
    r = outcome(lambda: sparse_swa.compressed_topk_to_global(md, **a))
    if isinstance(r, tuple):  # rows past the local top-k's (a taller out=) are not written
        n = len(a["local"])
        out, lens = r[0][:n], r[1][:n]
        assert (lens >= 0).all() and (lens <= out.shape[1]).all()
        assert ((out >= 0).sum(axis=1) == lens).all()  # lens counts the mapped entries


@FUZZ
@given(needed=scalar(int_values()), policy=scalar(st.sampled_from(
           ["flashmla_sparse_decode", "flashinfer_sm120_decode", "flashinfer_sm100",
            "rocm_ragged", "sparse_swa", "flashmla"])),
       heads=scalar(st.sampled_from([0, 8, 64, 128, 3])),
       seed=st.integers(0, 2**32 - 1))
def test_dispatch_functions(needed, policy, heads, seed):
    from sparse_swa import dispatch
    w = outcome(lambda: dispatch.choose_width(needed, policy, heads=heads))
    if isinstance(w, int):
        assert w >= needed
        # The smallest accepted width: choosing from it again gives it back.
        assert dispatch.choose_width(w, policy, heads=heads) == w
    config, _ = random_config(random.Random(seed))
    outcome(lambda: dispatch.validate_config(config, policy, heads=heads))
    outcome(lambda: dispatch.choose_noncausal_width(config, policy, heads=heads))
    outcome(lambda: dispatch.dispatch_tuples(config, policy, heads=heads))
