# SPDX-License-Identifier: Apache-2.0
"""Hostile but plausible input to the Python binding: strings C++ cannot take as they are, stale
metadata, empty host copies, cache views narrower than a page, huge or misaligned arrays and
numpy scalars / None where a value is expected. Every case is a ValueError naming the argument
with the expected and the actual value (or a correct result), never a crash or C++ text."""

import numpy as np
import pytest

import sparse_swa
from conftest import batch_arrays, load_case
from fake_dlpack import FakeHostArray

CONFIG = dict(window_size=8, block_size=4, max_num_batched_tokens=16, max_num_seqs=4,
              max_model_len=64)

CPP_TEXT = ("std::", "basic_string", "bad_cast", "bad_alloc", "incompatible function arguments")


def raises(exc, call, *parts):
    """`call()` raises `exc` whose message holds every part and no C++ text; the message."""
    with pytest.raises(exc) as e:
        call()
    message = str(e.value)
    for part in parts:
        assert part in message, (part, message)
    for text in CPP_TEXT:
        assert text not in message, message
    return message


# --------------------------------------------------------------------------- strings


@pytest.mark.parametrize(
    "config, parts",
    [
        ({**CONFIG, "speculative_method": "\ud800"},
         ["config.speculative_method: expected a str UTF-8 can encode, got '\\ud800'"]),
        ({**CONFIG, "speculative_method": "mtp\x00"},
         ["config.speculative_method: expected a str without NUL characters, got 'mtp\\x00'"]),
        ({**CONFIG, "\ud800": 16}, ["config key: expected a str UTF-8 can encode, got '\\ud800'"]),
        ({**CONFIG, "window_size\x00junk": 16},
         ["config key: expected a str without NUL characters, got 'window_size\\x00junk'"]),
        ({**CONFIG, 3: 16}, ["config key: expected a str, got int 3"]),
    ],
)
def test_config_strings_are_decoded_with_errors_checked(config, parts):
    raises(ValueError, lambda: sparse_swa.MetadataBuilder(config), *parts)


def test_builder_config_speculative_method_setter_checks_the_str():
    c = sparse_swa.BuilderConfig()

    def assign(value):
        c.speculative_method = value

    raises(ValueError, lambda: assign("\ud800"),
           "config.speculative_method: expected a str UTF-8 can encode, got '\\ud800'")
    raises(ValueError, lambda: assign("dspark\x00"),
           "config.speculative_method: expected a str without NUL characters, got 'dspark\\x00'")
    assert c.speculative_method == "none"
    assign("dspark")
    assert c.speculative_method == "dspark"


@pytest.mark.parametrize(
    "device, message",
    [
        ("cpu\x00", "device: expected a str without NUL characters, got 'cpu\\x00'"),
        ("\ud800", "device: expected a str UTF-8 can encode, got '\\ud800'"),
        (7, "device: expected a str, got int 7"),
        ("gpu", "device: expected None, \"cpu\" or \"cuda\", got 'gpu'"),
    ],
)
def test_device_str_is_checked(device, message):
    raises(ValueError, lambda: sparse_swa.MetadataBuilder(CONFIG, device=device), message)
    assert sparse_swa.MetadataBuilder(CONFIG, device="cpu").backends == ["cpu"]


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: sparse_swa.page_layout(64, "bf16\x00"),
         "dtype: expected a str without NUL characters, got 'bf16\\x00'"),
        (lambda: sparse_swa.page_layout(64, "\udcff"),
         "dtype: expected a str UTF-8 can encode, got '\\udcff'"),
        (lambda: sparse_swa.page_layout(64, "fp8_ds_mla", "flashmla\x00"),
         "consumer: expected a str without NUL characters, got 'flashmla\\x00'"),
        (lambda: sparse_swa.page_layout(64, "fp8_ds_mla", "\ud800"),
         "consumer: expected a str UTF-8 can encode, got '\\ud800'"),
        (lambda: sparse_swa.page_layout(64, "fp8_ds_mla", "nope"),
         "consumer: expected \"flashmla\" or \"flashinfer\", got 'nope'"),
        (lambda: sparse_swa.decode_kv(np.zeros((1, 37440), np.uint8), 64,
                                      np.zeros(0, np.int64), "fp8_ds_mla\x00"),
         "dtype: expected a str without NUL characters"),
    ],
)
def test_kv_strings_are_checked(call, message):
    raises(ValueError, call, message)


def test_a_type_name_utf8_cannot_encode_is_escaped_in_messages():
    odd_type = type("odd", (), {})
    odd_type.__module__ = "m\udcff"  # type names take no surrogates; module names do
    raises(ValueError, lambda: sparse_swa.MetadataBuilder(CONFIG, device=odd_type()),
           "device: expected a str, got m\\udcff.odd")
    raises(ValueError, lambda: sparse_swa.MetadataBuilder(odd_type()),
           "config: expected a dict or sparse_swa.BuilderConfig, got m\\udcff.odd")


@pytest.mark.parametrize(
    "kind, exc, message",
    [
        ("bad_alloc", MemoryError, "sparse_swa: out of memory"),
        ("bad_cast", RuntimeError, "sparse_swa: internal error in the Python binding"),
        ("length_error", RuntimeError, "sparse_swa: internal error in the Python binding"),
        ("int", RuntimeError, "sparse_swa: internal error in the Python binding"),
    ],
)
def test_cpp_exceptions_never_reach_the_user_as_cpp_text(kind, exc, message):
    from sparse_swa import _sparse_swa
    raises(exc, lambda: _sparse_swa._throw_cpp_exception(kind), message)


# --------------------------------------------------------------------------- stale metadata

STALE = "metadata: expected the metadata of its builder's last build() (2), got build 1"


def two_builds():
    """A builder's first build (2 decodes, then a prefill of 5 tokens) and its second."""
    builder = sparse_swa.MetadataBuilder(CONFIG)
    bt = np.arange(12, dtype=np.int32).reshape(3, 4)
    first = builder.build(np.array([0, 1, 2, 7], np.int32), np.array([3, 4, 9], np.int32), bt,
                          np.arange(7, dtype=np.int64))
    plan, snapshot = first.get_prefill_chunk_plan(4, 4), first.copy()
    second = builder.build(np.array([0, 3], np.int32), np.array([5], np.int32), bt[:1],
                           np.arange(3, dtype=np.int64))
    return first, second, plan, snapshot


def test_copy_and_chunk_plan_of_stale_metadata_raise_like_the_other_methods():
    first, second, plan, snapshot = two_builds()
    assert not first.is_current and second.is_current
    raises(ValueError, first.copy, STALE)
    raises(ValueError, lambda: first.get_prefill_chunk_plan(4, 4), STALE)
    raises(ValueError, first.mixed_matrix, STALE)
    raises(ValueError, lambda: first.combined_prefill(1, 4), STALE)
    # The current metadata and a snapshot taken in time still answer, with their own step:
    # N = seq_len // 4, M = N + query_len + min(prefix, W - 1).
    assert plan == [(0, 1, 9 // 4, 9 // 4 + 5 + 4)]
    assert snapshot.get_prefill_chunk_plan(4, 4) == plan
    assert snapshot.copy().get_prefill_chunk_plan(4, 4) == plan
    assert second.get_prefill_chunk_plan(4, 4) == [(0, 1, 5 // 4, 5 // 4 + 3 + 2)]
    assert second.copy().num_prefill_tokens == 3


# --------------------------------------------------------------------------- host copies


def mixed_step():
    return batch_arrays(load_case("mixed_mtp")["batch"])


@pytest.mark.parametrize(
    "copies, message",
    [
        ({"query_start_loc_cpu": np.zeros(0, np.int32)},
         "query_start_loc_cpu: expected 4 entries (a host copy of query_start_loc; None for no "
         "copy), got 0"),
        ({"seq_lens_cpu": np.zeros(0, np.int32)},
         "seq_lens_cpu: expected 3 entries (a host copy of seq_lens; None for no copy), got 0"),
        ({"seq_lens_cpu": np.zeros(2, np.int32)},
         "seq_lens_cpu: expected 3 entries (a host copy of seq_lens; None for no copy), got 2"),
    ],
)
def test_empty_host_copies_are_not_taken_for_absent(mixed_builder, copies, message):
    qsl, seq, bt, slots = mixed_step()
    raises(ValueError, lambda: mixed_builder.build(qsl, seq, bt, slots, **copies), message)
    md = mixed_builder.build(qsl, seq, bt, slots)
    raises(ValueError, lambda: mixed_builder.update_draft_decode_metadata(md, **copies), message)
    # None is absent; equal copies give the same step.
    again = mixed_builder.build(qsl, seq, bt, slots, query_start_loc_cpu=None,
                                seq_lens_cpu=seq.copy())
    assert again.num_decode_tokens == 3 and again.seq_lens_cpu.tolist() == seq.tolist()


def test_an_empty_batch_takes_empty_seq_lens_copies():
    builder = sparse_swa.MetadataBuilder(CONFIG)
    empty = np.zeros(0, np.int32)
    md = builder.build(np.zeros(1, np.int32), empty, np.zeros((0, 4), np.int32),
                       np.zeros(0, np.int64), query_start_loc_cpu=np.zeros(1, np.int32),
                       seq_lens_cpu=empty)
    assert md.num_reqs == 0 and md.num_tokens == 0


# --------------------------------------------------------------------------- cache views

LAYOUT = sparse_swa.page_layout(64)  # fp8_ds_mla: 584 content bytes a token, 37440-byte pages
NARROW = "expected >= 37376 columns (block_size 64 * 584 bytes of fp8_ds_mla, a page's content)"


def test_a_cache_view_narrower_than_a_page_is_rejected_before_any_access():
    assert (LAYOUT["content_bytes"], LAYOUT["page_bytes"]) == (37376, 37440)
    full = np.full((4, LAYOUT["page_bytes"]), 7, np.uint8)
    view = full[:, :100]
    rows = np.ones((1, 512), np.float32)
    slot = np.array([200], np.int64)  # block 3, token 8: bytes past column 100 of row 3
    raises(ValueError, lambda: sparse_swa.encode_kv(view, 64, rows, slot),
           f"cache: {NARROW}, got 100")
    assert (full == 7).all()
    raises(ValueError, lambda: sparse_swa.decode_kv(view, 64, slot), f"cache: {NARROW}, got 100")
    q = np.zeros((1, 1, 512), np.uint16)
    raises(ValueError,
           lambda: sparse_swa.sparse_attention(q, view, 64, np.array([[200]], np.int32),
                                               np.array([1], np.int32)),
           f"swa_cache: {NARROW}, got 100")
    raises(ValueError, lambda: sparse_swa.decode_kv(full[:, :37375], 64, slot),
           f"cache: {NARROW}, got 37375")
    raises(ValueError, lambda: sparse_swa.decode_kv(full[:1, :100], 64, np.array([0], np.int64)),
           f"cache: {NARROW}, got 100")


def test_a_cache_view_of_exactly_the_page_content_works_like_the_whole_page():
    rng = np.random.default_rng(3)
    rows = rng.standard_normal((3, 512)).astype(np.float32)
    slots = np.array([5, 200, 130], np.int64)
    whole = np.zeros((4, LAYOUT["page_bytes"]), np.uint8)
    sparse_swa.encode_kv(whole, 64, rows, slots)
    cut = np.zeros_like(whole)
    sparse_swa.encode_kv(cut[:, :LAYOUT["content_bytes"]], 64, rows, slots)
    assert (cut == whole).all()
    assert (sparse_swa.decode_kv(cut[:, :LAYOUT["content_bytes"]], 64, slots)
            == sparse_swa.decode_kv(whole, 64, slots)).all()


# --------------------------------------------------------------------------- sizes and alignment


def fake_view(shape, strides, dtype=np.int32):
    """A view of a small buffer claiming `shape`; only valid where the binding must not read."""
    return np.lib.stride_tricks.as_strided(np.zeros(16, dtype), shape=shape, strides=strides)


def test_to_ragged_never_narrows_the_width():
    wide = fake_view((1, 2**32), (0, 4))
    raises(ValueError, lambda: sparse_swa.to_ragged(wide, np.zeros(1, np.int32)),
           "indices: expected a width (columns) <= 2147483647, got 4294967296")


RAGGED_TOO_BIG = """
import resource, numpy as np, sparse_swa
with open("/proc/self/status") as status:
    used = int(status.read().split("VmSize:")[1].split()[0]) << 10
limit = used + (1 << 30)  # 1 GiB more: the 8 GiB of values a late check allocates cannot be had
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
view = np.lib.stride_tricks.as_strided(np.zeros(16, np.int32), shape=(2**16, 2**15),
                                       strides=(2**17, 4))
try:
    sparse_swa.to_ragged(view, np.zeros(2**16, np.int32))
except ValueError as e:
    print(e)
"""


def test_to_ragged_checks_the_capacity_before_allocating():
    import subprocess
    import sys
    run = subprocess.run([sys.executable, "-c", RAGGED_TOO_BIG], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == ("indices: expected rows x width <= 2147483647 (the int32 "
                                  "indptr), got 65536 x 32768 = 2147483648")


def test_to_ragged_checks_the_lens_before_allocating():
    indices = np.arange(12, dtype=np.int32).reshape(3, 4)
    raises(ValueError, lambda: sparse_swa.to_ragged(indices, np.array([1, 5, 0], np.int32)),
           "lens[1]: expected 0..4 (the row width), got 5")
    indptr, flat = sparse_swa.to_ragged(indices, np.array([1, 4, 0], np.int32))
    assert indptr.tolist() == [0, 1, 5, 5] and flat.tolist() == [0, 4, 5, 6, 7]


def attention_args(tokens=1, heads=1):
    cache = np.zeros((1, LAYOUT["page_bytes"]), np.uint8)
    return (np.zeros((tokens, heads, 512), np.uint16), cache, 64,
            np.zeros((tokens, 1), np.int32), np.ones(tokens, np.int32))


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda a: (np.zeros((2, 129, 512), np.uint16),) + a[1:],
         "q: expected 1..128 heads (dimension 1), got 129 (shape [2, 129, 512])"),
        (lambda a: (np.zeros((2, 0, 512), np.uint16),) + a[1:],
         "q: expected 1..128 heads (dimension 1), got 0 (shape [2, 0, 512])"),
        (lambda a: (np.zeros((1, 1, 448), np.uint16),) + a[1:], "q: expected head dim 512, got 448"),
        (lambda a: a[:3] + (np.zeros((2, 1), np.int32), np.ones(2, np.int32)),
         "indices: expected 1 rows (the tokens of q), got 2"),
        (lambda a: a[:3] + (fake_view((1, 2**32), (0, 4)),) + a[4:],
         "indices: expected a width (columns) <= 2147483647, got 4294967296"),
    ],
)
def test_sparse_attention_checks_shapes_before_allocating(change, message):
    raises(ValueError, lambda: sparse_swa.sparse_attention(*change(attention_args())), message)


def misaligned(shape, dtype):
    """A C-contiguous array of `shape` whose data starts one byte into an aligned buffer."""
    dtype = np.dtype(dtype)
    count = int(np.prod(shape))
    raw = np.zeros(count * dtype.itemsize + 16, np.uint8)
    base = (-raw.ctypes.data) % 16  # the 16-byte aligned offset, plus one
    return np.frombuffer(raw.data, dtype, count, base + 1).reshape(shape)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda q, c, idx, lens: sparse_swa.sparse_attention(misaligned((1, 1, 512), np.uint16), c,
                                                             64, idx, lens),
         "q: expected 2-byte aligned data"),
        (lambda q, c, idx, lens: sparse_swa.sparse_attention(q, c, 64,
                                                             misaligned((1, 1), np.int32), lens),
         "indices: expected 4-byte aligned data"),
        (lambda q, c, idx, lens: sparse_swa.sparse_attention(q, c, 64, idx,
                                                             misaligned((1,), np.int32)),
         "lens: expected 4-byte aligned data"),
        (lambda q, c, idx, lens: sparse_swa.sparse_attention(q, c, 64, idx, lens,
                                                             sinks=misaligned((1,), np.float32)),
         "sinks: expected 4-byte aligned data"),
        (lambda q, c, idx, lens: sparse_swa.encode_kv(c, 64, misaligned((1, 512), np.float32),
                                                      np.zeros(1, np.int64)),
         "rows: expected 4-byte aligned data"),
        (lambda q, c, idx, lens: sparse_swa.decode_kv(c, 64, misaligned((1,), np.int64)),
         "slots: expected 8-byte aligned data"),
        (lambda q, c, idx, lens: sparse_swa.to_ragged(misaligned((1, 4), np.int32), lens),
         "indices: expected 4-byte aligned data"),
    ],
)
def test_misaligned_arrays_are_rejected_like_build_rejects_them(call, message):
    q, cache, _, idx, lens = attention_args()
    raises(ValueError, lambda: call(q, cache, idx, lens), message)


# --------------------------------------------------------------------------- scalars and None


def small_step():
    return (np.array([0, 1, 2], np.int32), np.array([3, 4], np.int32),
            np.arange(4, dtype=np.int32).reshape(2, 2), np.array([2, 7], np.int64))


def test_numpy_scalars_are_taken_where_python_scalars_are():
    builder = sparse_swa.MetadataBuilder({**CONFIG, "window_size": np.int64(8)},
                                         cuda_stream=np.uint64(0))
    plain = builder.build(*small_step()).copy()
    md = builder.build(*small_step(), causal=np.bool_(True))
    assert md.decode_swa_lens.tolist() == plain.decode_swa_lens.tolist() == [3, 4]
    # Request 1 (seq_len 4) reads positions 0..3 of block_table[1][0] = block 2: slots 8..11.
    assert md.decode_swa_indices[:, 0].tolist() == [[0, 1, 2, -1, -1, -1, -1, -1],
                                                    [8, 9, 10, 11, -1, -1, -1, -1]]
    assert md.get_prefill_chunk_plan(np.int32(4), np.int64(4), np.bool_(False)) == []
    assert md.combined_prefill(np.int8(1), np.int16(4)) == []
    assert sparse_swa.page_layout(np.int64(64))["page_bytes"] == 37440
    c = sparse_swa.BuilderConfig()
    c.window_size, c.parallel_drafting, c.compress_ratios = np.int32(16), np.bool_(False), [
        np.int64(4)]
    assert (c.window_size, c.parallel_drafting, c.compress_ratios) == (16, False, [4])
    out, lse = sparse_swa.sparse_attention(*attention_args(), scale=np.float32(0.5))
    assert out.shape == (1, 1, 512) and lse.shape == (1, 1)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda b: b.build(*small_step(), causal=1), "causal: expected a bool, got int 1"),
        (lambda b: b.build(*small_step(), causal=None), "causal: expected a bool, got None"),
        (lambda b: b.build(*small_step(), causal=np.int8(0)), "causal: expected a bool, got int8 0"),
        (lambda b: sparse_swa.MetadataBuilder(CONFIG, cuda_stream=-1),
         "cuda_stream: expected an int in [0, 9223372036854775807], got -1"),
        (lambda b: sparse_swa.MetadataBuilder(CONFIG, cuda_stream=1.5),
         "cuda_stream: expected an int, got float 1.5"),
        (lambda b: sparse_swa.MetadataBuilder(None),
         "config: expected a dict or sparse_swa.BuilderConfig, got None"),
        (lambda b: sparse_swa.BuilderConfig.from_dict([("window_size", 8)]),
         "config: expected a dict, got list"),
        (lambda b: b.update_draft_decode_metadata(None),
         "metadata: expected the SwaMetadata returned by build(), got None"),
        (lambda b: b.update_draft_decode_rows(3, *small_step()),
         "metadata: expected the SwaMetadata returned by build(), got int 3"),
        (lambda b: b.build(*small_step()).get_prefill_chunk_plan(4.0, 4),
         "compress_ratio: expected an int, got float 4.0"),
        (lambda b: b.build(*small_step()).get_prefill_chunk_plan(4, None),
         "prefill_chunk_size: expected an int, got None"),
        (lambda b: b.build(*small_step()).get_prefill_chunk_plan(4, 4, 1),
         "has_compressed: expected a bool, got int 1"),
        (lambda b: b.build(*small_step()).combined_prefill(1, "4"),
         "chunk_size: expected an int, got str '4'"),
        (lambda b: sparse_swa.page_layout(64.0), "block_size: expected an int, got float 64.0"),
        (lambda b: sparse_swa.page_layout(True), "block_size: expected an int, got bool True"),
        (lambda b: sparse_swa.page_layout(2**31),
         "block_size: expected an int in [-2147483648, 2147483647], got 2147483648"),
        (lambda b: sparse_swa.page_layout(64, None), "dtype: expected a str, got None"),
        (lambda b: sparse_swa.to_ragged(None, np.zeros(1, np.int32)),
         "indices: expected an array supporting DLPack or the buffer protocol (numpy, torch, "
         "cupy, jax), got NoneType"),
        (lambda b: sparse_swa.to_ragged(np.zeros((1, 4), np.int32), None),
         "lens: expected an array supporting DLPack"),
        (lambda b: sparse_swa.encode_kv(None, 64, np.zeros((1, 512), np.float32),
                                        np.zeros(1, np.int64)),
         "cache: expected a writable array supporting DLPack or the buffer protocol (numpy, "
         "torch, cupy, jax), got NoneType"),
        (lambda b: sparse_swa.encode_kv(np.zeros((1, 37440), np.uint8), 64, None,
                                        np.zeros(1, np.int64)),
         "rows: expected an array supporting DLPack"),
        (lambda b: sparse_swa.encode_kv(np.zeros((1, 37440), np.uint8), 64.0,
                                        np.zeros((1, 512), np.float32), np.zeros(1, np.int64)),
         "block_size: expected an int, got float 64.0"),
        (lambda b: sparse_swa.decode_kv(np.zeros((1, 37440), np.uint8), 64, None),
         "slots: expected an array supporting DLPack"),
        (lambda b: sparse_swa.sparse_attention(None, *attention_args()[1:]),
         "q: expected an array supporting DLPack or the buffer protocol (numpy, torch, cupy, "
         "jax), got NoneType"),
        (lambda b: sparse_swa.sparse_attention(*attention_args()[:3], None, np.ones(1, np.int32)),
         "indices: expected an array supporting DLPack"),
        (lambda b: sparse_swa.sparse_attention(*attention_args()[:2], None,
                                               *attention_args()[3:]),
         "swa_block_size: expected an int, got None"),
        (lambda b: sparse_swa.sparse_attention(*attention_args(), scale="0.5"),
         "scale: expected a float, got str '0.5'"),
        (lambda b: sparse_swa.sparse_attention(*attention_args(), scale=1e300),
         "scale: expected a float32 value (|x| <= 3.40282e+38), got 1e+300"),
    ],
)
def test_values_of_the_wrong_kind_are_value_errors_naming_the_argument(call, message):
    raises(ValueError, lambda: call(sparse_swa.MetadataBuilder(CONFIG)), message)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("window_size", 2**31, "config.window_size: expected an int in [-2147483648, 2147483647], "
                               "got 2147483648"),
        ("window_size", None, "config.window_size: expected an int, got None"),
        ("block_size", 4.0, "config.block_size: expected an int, got float 4.0"),
        ("max_model_len", 2**63, "config.max_model_len: expected an int in "
                                 "[-9223372036854775808, 9223372036854775807], got "
                                 "9223372036854775808"),
        ("parallel_drafting", 1, "config.parallel_drafting: expected a bool, got int 1"),
        ("compress_ratios", [1, "4"], "config.compress_ratios[1]: expected an int, got str '4'"),
        ("compress_ratios", None, "config.compress_ratios: expected a list of ints, got NoneType"),
        ("speculative_method", None, "config.speculative_method: expected a str, got None"),
    ],
)
def test_builder_config_setters_raise_value_errors_naming_the_field(field, value, message):
    c = sparse_swa.BuilderConfig()
    before = c.to_dict()
    raises(ValueError, lambda: setattr(c, field, value), message)
    assert c.to_dict() == before


def test_an_int_too_long_to_print_is_still_a_value_error():
    c = sparse_swa.BuilderConfig()
    raises(ValueError, lambda: setattr(c, "max_model_len", 10**5000),
           "config.max_model_len: expected an int in [-9223372036854775808, "
           "9223372036854775807], got <int object>")


def test_objects_made_by_new_without_init_are_value_errors():
    bare_config = sparse_swa.BuilderConfig.__new__(sparse_swa.BuilderConfig)
    raises(ValueError, lambda: sparse_swa.MetadataBuilder(bare_config),
           "config: expected an initialized BuilderConfig, got one made by __new__")
    bare_md = sparse_swa.SwaMetadata.__new__(sparse_swa.SwaMetadata)
    builder = sparse_swa.MetadataBuilder(CONFIG)
    raises(ValueError, lambda: builder.update_draft_decode_metadata(bare_md),
           "metadata: expected the SwaMetadata returned by build(), got one made by __new__")
    raises(ValueError, lambda: builder.update_draft_decode_rows(bare_md, *small_step()),
           "metadata: expected the SwaMetadata returned by build(), got one made by __new__")


# --------------------------------------------------------------------------- resource limits

HUGE = 2**40  # two such dimensions: 2**80 elements, past int64


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: sparse_swa.to_ragged(FakeHostArray([HUGE, HUGE]), np.zeros(1, np.int32)),
         "indices: shape [1099511627776, 1099511627776] (itemsize 4) has more elements or bytes "
         "than int64 can count"),
        (lambda: sparse_swa.to_ragged(np.zeros((1, 1), np.int32), FakeHostArray([2**62])),
         "lens: shape [4611686018427387904] (itemsize 4) has more elements or bytes"),
        (lambda: sparse_swa.decode_kv(FakeHostArray([HUGE, HUGE], "uint8"), 64,
                                      np.zeros(1, np.int64)),
         "cache: shape [1099511627776, 1099511627776] (itemsize 1)"),
        (lambda: sparse_swa.encode_kv(FakeHostArray([HUGE, HUGE], "uint8"), 64,
                                      np.zeros((1, 512), np.float32), np.zeros(1, np.int64)),
         "cache: shape [1099511627776, 1099511627776] (itemsize 1)"),
        (lambda: sparse_swa.sparse_attention(FakeHostArray([HUGE, 128, 2**20], "uint16"),
                                             np.zeros((1, 37440), np.uint8), 64,
                                             np.zeros((1, 1), np.int32), np.zeros(1, np.int32)),
         "q: shape [1099511627776, 128, 1048576] (itemsize 2)"),
        (lambda: sparse_swa.MetadataBuilder(CONFIG).build(
            FakeHostArray([2**62]), np.zeros(0, np.int32), np.zeros((0, 1), np.int32),
            np.zeros(0, np.int64)),
         "query_start_loc: shape [4611686018427387904] (itemsize 4)"),
        (lambda: sparse_swa.MetadataBuilder(CONFIG).build(
            np.zeros(1, np.int32), np.zeros(0, np.int32), FakeHostArray([0, 4], strides=[4, 1]),
            FakeHostArray([-3], "int64")),
         "slot_mapping: expected dimensions >= 0, got shape [-3]"),
    ],
)
def test_arrays_whose_size_overflows_int64_are_value_errors_before_any_read(call, message):
    raises(ValueError, call, message)


def test_a_countable_array_past_the_address_space_still_fails_before_allocating():
    # 2**55 slots fit int64 (2**58 bytes), but the [n, 512] float32 output would not.
    raises(ValueError, lambda: sparse_swa.decode_kv(
        np.zeros((1, 37440), np.uint8), 64, FakeHostArray([2**55], "int64")),
        "slots: the output's shape [36028797018963968, 512] has more bytes than int64 can count")
