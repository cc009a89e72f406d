# SPDX-License-Identifier: Apache-2.0
"""Aliasing and lifetime: outputs alias the builder's persistent buffers (valid until its next
build), keep the builder alive, and copy() detaches them."""

import gc
import weakref

import numpy as np
import pytest

import sparse_swa
from conftest import batch_arrays, build_case, load_case


def decode_only_batch(seq_lens, block_table):
    n = len(seq_lens)
    qsl = np.arange(n + 1, dtype=np.int32)
    seq = np.array(seq_lens, dtype=np.int32)
    bt = np.array(block_table, dtype=np.int32)
    slots = np.array([bt[r][(s - 1) // 4] * 4 + (s - 1) % 4 for r, s in enumerate(seq_lens)],
                     dtype=np.int64)
    return qsl, seq, bt, slots


def test_outputs_alias_persistent_buffers(mixed_builder, mixed_case):
    first = build_case(mixed_builder, mixed_case)
    rows = first.decode_swa_indices
    lens = first.decode_swa_lens
    snapshot = first.copy()
    assert rows.ctypes.data == first.decode_swa_indices.ctypes.data  # cached, one view

    # A second, different build overwrites the same buffers in place.
    second = mixed_builder.build(*decode_only_batch([3, 9], [[7, 3, 9, 2], [5, 11, 6, 0]]))
    assert second.decode_swa_indices.ctypes.data == rows.ctypes.data
    assert second.decode_swa_lens.ctypes.data == lens.ctypes.data
    assert rows[:2, 0].tolist() == second.decode_swa_indices[:, 0].tolist()
    assert rows[:2, 0].tolist() == [[28, 29, 30, -1, -1, -1, -1, -1],
                                    [21, 22, 23, 44, 45, 46, 47, 24]]
    assert lens.tolist() == [3, 8, 0]  # the lens tail past Td is zeroed by the new build
    assert not first.is_current and second.is_current

    # The copy kept the first step's values.
    assert snapshot.decode_swa_indices[:, 0].tolist() == [
        [31, 12, 13, 14, 15, 36, 37, 38],
        [20, 21, 22, 23, 44, -1, -1, -1],
        [20, 21, 22, 23, 44, 45, -1, -1],
    ]
    assert snapshot.decode_swa_lens.tolist() == [8, 5, 6]
    assert snapshot.decode_swa_indices.ctypes.data != rows.ctypes.data
    assert snapshot.get_prefill_chunk_plan(4, 4) == [(0, 1, 2, 12)]
    assert snapshot.backend is None and not snapshot.is_current
    assert snapshot.num_decode_tokens == 3 and snapshot.tile_sched_c4a == "c4a"


def test_arrays_keep_builder_alive(mixed_case):
    builder = sparse_swa.MetadataBuilder(mixed_case["config"])
    alive = weakref.ref(builder)
    md = build_case(builder, mixed_case)
    rows = md.decode_swa_indices
    del builder, md
    gc.collect()
    assert alive() is not None  # the array's owner chain holds the builder
    assert rows[0, 0].tolist() == [31, 12, 13, 14, 15, 36, 37, 38]
    del rows
    gc.collect()
    assert alive() is None


def test_metadata_keeps_builder_alive(mixed_case):
    builder = sparse_swa.MetadataBuilder(mixed_case["config"])
    alive = weakref.ref(builder)
    md = build_case(builder, mixed_case)
    del builder
    gc.collect()
    assert alive() is not None
    assert md.prefill_swa_lens.tolist() == [7, 8, 8, 8]
    del md
    gc.collect()
    assert alive() is None


def test_copy_does_not_keep_builder_alive(mixed_case):
    builder = sparse_swa.MetadataBuilder(mixed_case["config"])
    alive = weakref.ref(builder)
    snap = build_case(builder, mixed_case).copy()
    del builder
    gc.collect()
    assert alive() is None
    assert snap.prefill_swa_indices[0, 0].tolist() == [4, 5, 6, 7, 16, 17, 18, -1]
    assert snap.is_valid_token.dtype == np.bool_ and snap.is_valid_token.all()


def test_outputs_are_writable_views_like_the_reference_tensors(mixed_builder, mixed_case):
    md = build_case(mixed_builder, mixed_case)
    md.decode_swa_lens[0] = 123  # engines may patch lens in place (the reference's tensors allow it)
    assert md.decode_swa_lens[0] == 123
    again = mixed_builder.build(*batch_arrays(mixed_case["batch"]))
    assert again.decode_swa_lens[0] == 8


def test_inputs_are_carried_not_copied(mixed_builder, mixed_case):
    arrays = batch_arrays(mixed_case["batch"])
    md = mixed_builder.build(*arrays)
    assert md.query_start_loc is arrays[0] and md.seq_lens is arrays[1]
    assert md.block_table is arrays[2] and md.slot_mapping is arrays[3]
    assert md.query_start_loc_cpu is None and md.seq_lens_cpu is None
    assert np.shares_memory(md.prefill_seq_lens, arrays[1])


def test_cpu_backend_created_on_first_build(mixed_case):
    builder = sparse_swa.MetadataBuilder(mixed_case["config"])
    assert builder.backends == []
    build_case(builder, mixed_case)
    assert builder.backends == ["cpu"]
    assert sparse_swa.MetadataBuilder(mixed_case["config"], device="cpu").backends == ["cpu"]


def test_metadata_from_other_builder_is_rejected(mixed_case):
    a = sparse_swa.MetadataBuilder(mixed_case["config"])
    b = sparse_swa.MetadataBuilder(mixed_case["config"])
    md = build_case(a, mixed_case)
    with pytest.raises(ValueError, match="metadata: expected metadata built by this MetadataBuilder"):
        b.update_draft_decode_metadata(md)
