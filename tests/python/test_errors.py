# SPDX-License-Identifier: Apache-2.0
"""Every error class through Python: ValueError naming the field for invalid input (config,
batch values, array dtype/rank/layout/device), NotImplementedError, RuntimeError."""

import numpy as np
import pytest

import sparse_swa
from conftest import batch_arrays, load_case
from fake_dlpack import FakeCudaArray, fake_cuda_batch

CONFIG = load_case("mixed_mtp")["config"]


def with_config(**changes):
    return {**CONFIG, **changes}


# --------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"window_size": 0}, "config.window_size: expected >= 1, got 0"),
        ({"block_size": -4}, "config.block_size: expected >= 1, got -4"),
        ({"speculative_method": "eagle"},
         'config.speculative_method: expected one of none, mtp, dspark, got "eagle"'),
        ({"compress_ratios": [1, 3]},
         "config.compress_ratios[1]: expected a compress ratio in {1, 2, 4, 128}, got 3"),
        ({"speculative_method": "none", "num_speculative_tokens": 2},
         "config.num_speculative_tokens: expected 0 with speculative_method none, got 2"),
        ({"window_size": "8"}, "config.window_size: expected an int, got str"),
        ({"parallel_drafting": 1}, "config.parallel_drafting: expected a bool, got int"),
        ({"compress_ratios": 4}, "config.compress_ratios: expected a list of ints, got int"),
        ({"compress_ratios": [1, "4"]}, "config.compress_ratios[1]: expected an int, got str"),
        ({"window_size": 2**40}, "config.window_size: expected an int in [-2147483648, "),
        ({"windowsize": 8}, 'config: unknown field "windowsize"'),
        ({"windw_size": 8},
         'config: unknown field "windw_size" (did you mean "window_size"? expected one of '
         "window_size, block_size,"),
        ({"temperature": 0.7}, 'config: unknown field "temperature" (expected one of window_size'),
    ],
)
def test_config_errors(changes, message):
    with pytest.raises(ValueError) as e:
        sparse_swa.MetadataBuilder(with_config(**changes))
    assert message in str(e.value)


def test_config_type_error():
    with pytest.raises(ValueError, match="config: expected a dict or sparse_swa.BuilderConfig, got list"):
        sparse_swa.MetadataBuilder([8, 4])


def test_builder_config_object_round_trip():
    c = sparse_swa.BuilderConfig.from_dict(CONFIG)
    assert c.to_dict() == {**CONFIG, "noncausal_index_width": 0, "model_runner_v2": False,
                           "widen_image_spans": True, "flashinfer_decode_lens": False}
    c.window_size = 16
    c.speculative_method = "dspark"
    b = sparse_swa.MetadataBuilder(c)
    assert b.config.window_size == 16 and b.config.speculative_method == "dspark"
    assert b.noncausal_index_width == 64
    with pytest.raises(ValueError, match='config.speculative_method: expected one of'):
        c.speculative_method = "medusa"
    c.window_size = 0
    with pytest.raises(ValueError, match="config.window_size: expected >= 1, got 0"):
        sparse_swa.MetadataBuilder(c)


def test_builder_options_errors():
    with pytest.raises(ValueError, match='device: expected None, "cpu" or "cuda", got \'tpu\''):
        sparse_swa.MetadataBuilder(CONFIG, device="tpu")
    with pytest.raises(ValueError, match="tile_sched_factory: expected None or a callable"):
        sparse_swa.MetadataBuilder(CONFIG, tile_sched_factory=3)


# --------------------------------------------------------------------------- batch values


def mixed_batch():
    return list(batch_arrays(load_case("mixed_mtp")["batch"]))


def test_batch_value_errors_name_the_field(mixed_builder):
    qsl, seq, bt, slots = mixed_batch()
    seq[1] = 1  # request 1 has 2 query tokens
    with pytest.raises(ValueError, match=r"^seq_lens\[1\]: expected >= the query length 2"):
        mixed_builder.build(qsl, seq, bt, slots)

    qsl, seq, bt, slots = mixed_batch()
    with pytest.raises(ValueError, match=r"^block_table\[0\]: expected at least ceil"):
        mixed_builder.build(qsl, seq, np.ascontiguousarray(bt[:, :2]), slots)

    with pytest.raises(ValueError, match=r"^query_start_loc: expected num_reqs \+ 1 = 4"):
        mixed_builder.build(qsl[:3], seq, bt, slots)

    with pytest.raises(ValueError, match="^causal: false .* needs speculative_method dspark"):
        mixed_builder.build(qsl, seq, bt, slots, causal=False)

    too_many = np.full(65, -1, dtype=np.int64)
    with pytest.raises(ValueError, match="max_num_batched_tokens = 64"):
        mixed_builder.build(qsl, seq, bt, too_many)


def test_failed_build_writes_nothing(mixed_builder):
    qsl, seq, bt, slots = mixed_batch()
    md = mixed_builder.build(qsl, seq, bt, slots)
    before = md.copy()
    bad = seq.copy()
    bad[2] = 3  # request 2 has 4 query tokens
    with pytest.raises(ValueError):
        mixed_builder.build(qsl, bad, bt, slots)
    assert md.is_current
    np.testing.assert_array_equal(md.decode_swa_indices, before.decode_swa_indices)
    np.testing.assert_array_equal(md.prefill_swa_indices, before.prefill_swa_indices)


def test_image_span_errors():
    case = load_case("vision_prefill")
    b = sparse_swa.MetadataBuilder(case["config"])
    arrays = batch_arrays(case["batch"])
    with pytest.raises(ValueError, match=r"image_spans: expected None or a dict"):
        b.build(*arrays, image_spans=[(3, 7)])
    with pytest.raises(ValueError, match=r"image_spans\[0\]\[0\]: expected a \(start, end\) pair"):
        b.build(*arrays, image_spans={0: [(3, 7, 9)]})
    with pytest.raises(ValueError, match=r"image_spans\[0\]\[0\] end: expected an int, got float"):
        b.build(*arrays, image_spans={0: [(3, 7.0)]})
    with pytest.raises(ValueError, match=r"^image_spans\[0\]: expected end < seq_lens\[0\]"):
        b.build(*arrays, image_spans={0: [(3, 12)]})


# --------------------------------------------------------------------------- arrays


@pytest.mark.parametrize(
    "index, bad, message",
    [
        (0, lambda a: a.astype(np.int64), "query_start_loc: expected dtype int32, got int64"),
        (1, lambda a: a.astype(np.float32), "seq_lens: expected dtype int32, got float32"),
        (3, lambda a: a.astype(np.int32), "slot_mapping: expected dtype int64, got int32"),
        (2, lambda a: a.astype(np.uint32), "block_table: expected dtype int32, got uint32"),
        (2, lambda a: a.reshape(-1), "block_table: expected 2 dimensions, got 1"),
        (1, lambda a: a.reshape(1, -1), "seq_lens: expected 1 dimension, got 2"),
        (3, lambda a: np.repeat(a, 2)[::2], "slot_mapping: expected a contiguous array (stride 1), got stride 2"),
        (2, lambda a: np.asfortranarray(np.tile(a, (1, 2))), "block_table: expected rows with unit column stride"),
        (0, lambda a: a.tolist(), "query_start_loc: expected an array supporting DLPack"),
        (1, lambda a: None, "seq_lens: expected an array supporting DLPack or the buffer protocol (numpy, torch, cupy, jax), got NoneType"),
    ],
)
def test_array_errors(mixed_builder, index, bad, message):
    arrays = mixed_batch()
    arrays[index] = bad(arrays[index])
    with pytest.raises(ValueError) as e:
        mixed_builder.build(*arrays)
    assert message in str(e.value)


def test_host_copy_errors(mixed_builder):
    qsl, seq, bt, slots = mixed_batch()
    with pytest.raises(ValueError, match="query_start_loc_cpu: expected dtype int32, got int64"):
        mixed_builder.build(qsl, seq, bt, slots, query_start_loc_cpu=qsl.astype(np.int64))
    with pytest.raises(ValueError, match=r"seq_lens_cpu: expected 3 entries \(a host copy of seq_lens; None for no copy\), got 2"):
        mixed_builder.build(qsl, seq, bt, slots, seq_lens_cpu=seq[:2])


def test_layout_variants_are_taken_without_copy(mixed_builder):
    qsl, seq, bt, slots = mixed_batch()
    expected = mixed_builder.build(qsl, seq, bt, slots).copy()
    # A capacity block table (more rows and columns than needed) sliced to the batch.
    wide = np.full((8, 16), 999, dtype=np.int32)
    wide[:3, :4] = bt
    ro = [a.copy() for a in (qsl, seq, slots)]
    for a in ro:
        a.flags.writeable = False
    md = mixed_builder.build(ro[0], ro[1], wide[:, :4], ro[2])
    np.testing.assert_array_equal(md.decode_swa_indices, expected.decode_swa_indices)
    np.testing.assert_array_equal(md.prefill_swa_indices, expected.prefill_swa_indices)
    assert md.block_table.base is wide and md.seq_lens is ro[1]


# --------------------------------------------------------------------------- device arrays


def test_cuda_arrays_need_host_copies(mixed_builder):
    with pytest.raises(ValueError, match="query_start_loc_cpu: required with cuda arrays"):
        mixed_builder.build(*fake_cuda_batch())
    qsl = np.array([0, 1, 2], dtype=np.int32)
    with pytest.raises(ValueError, match="seq_lens_cpu: required with cuda arrays"):
        mixed_builder.build(*fake_cuda_batch(), query_start_loc_cpu=qsl)
    with pytest.raises(ValueError, match=r"seq_lens_cpu: expected device cpu \(a host copy\), got cuda:0"):
        mixed_builder.build(*fake_cuda_batch(), query_start_loc_cpu=qsl,
                            seq_lens_cpu=FakeCudaArray([2]))


def test_mixed_devices_are_rejected(mixed_builder):
    qsl, seq, bt, slots = mixed_batch()
    with pytest.raises(ValueError, match="seq_lens: expected device cpu like query_start_loc, got cuda:0"):
        mixed_builder.build(qsl, FakeCudaArray([3]), bt, slots)
    fq, fs, fb, fsl = fake_cuda_batch()
    with pytest.raises(ValueError, match="slot_mapping: expected device cuda:0 like query_start_loc, got cuda:1"):
        mixed_builder.build(fq, fs, fb, FakeCudaArray([2], "int64", device_id=1))
    with pytest.raises(ValueError, match="block_table: expected dtype int32, got int64"):
        mixed_builder.build(fq, fs, FakeCudaArray([2, 4], "int64"), fsl,
                            query_start_loc_cpu=qsl, seq_lens_cpu=seq)


@pytest.mark.skipif(sparse_swa.cuda_available(), reason="needs a machine without a usable GPU")
def test_cuda_arrays_without_cuda_backend_raise_runtime_error(mixed_builder):
    qsl = np.array([0, 1, 2], dtype=np.int32)
    seq = np.array([3, 4], dtype=np.int32)
    with pytest.raises(RuntimeError, match="backend cuda: "):
        mixed_builder.build(*fake_cuda_batch(), query_start_loc_cpu=qsl, seq_lens_cpu=seq)
    with pytest.raises(RuntimeError, match="backend cuda: "):
        sparse_swa.MetadataBuilder(CONFIG, device="cuda")
    assert mixed_builder.backends == []


# --------------------------------------------------------------------------- status mapping


@pytest.mark.parametrize(
    "code, exc",
    [
        ("INVALID_ARGUMENT", ValueError),
        ("UNIMPLEMENTED", NotImplementedError),
        ("UNAVAILABLE", RuntimeError),
        ("INTERNAL", RuntimeError),
    ],
)
def test_status_code_mapping(code, exc):
    with pytest.raises(exc) as e:
        sparse_swa._sparse_swa._raise_status(code, "field.x: expected 1, got 2")
    assert type(e.value) is exc
    assert str(e.value) == "field.x: expected 1, got 2"


def test_failed_dlpack_export_is_explained(mixed_builder):
    class Refusing:
        def __dlpack__(self, *args, **kwargs):
            raise BufferError("requires grad")

        def __dlpack_device__(self):
            return (1, 0)

    qsl, seq, bt, slots = mixed_batch()
    with pytest.raises(ValueError, match=r"block_table: its DLPack export failed \(.*Refusing; a torch tensor"):
        mixed_builder.build(qsl, seq, Refusing(), slots)
