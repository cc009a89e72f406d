# SPDX-License-Identifier: Apache-2.0
"""MetadataBuilder.build_groups: several KV-cache groups' metadata in one call
(docs/design.md#one-build-for-several-groups). Each group equals its own build(); errors name the
argument; nothing is written when a group fails. The GPU form runs in test_gpu.py's environment
(skipped here without a device)."""

import numpy as np
import pytest

import sparse_swa
from conftest import batch_arrays, load_case


def group_config(window, block):
    return dict(window_size=window, block_size=block, max_num_batched_tokens=64, max_num_seqs=8,
                max_model_len=64, speculative_method="mtp", num_speculative_tokens=1)


def tables(block, seq, seed):
    """A block table with random pages for `block`-token pages, and the slots of each request's
    query tokens."""
    rng = np.random.default_rng(seed)
    cols = max(-(-s // block) for s in seq)
    return rng.integers(0, 1000, size=(len(seq), cols), dtype=np.int32)


def slots_of(bt, block, qsl, seq):
    out = []
    for r in range(len(seq)):
        ql = qsl[r + 1] - qsl[r]
        for p in range(seq[r] - ql, seq[r]):
            out.append(int(bt[r][p // block]) * block + p % block)
    return np.array(out, np.int64)


def three_groups():
    case = load_case("mixed_mtp")
    qsl, seq, _, _ = batch_arrays(case["batch"])
    shapes = [(8, 4), (4, 2), (16, 8)]
    builders = [sparse_swa.MetadataBuilder(group_config(w, b)) for w, b in shapes]
    bts = [tables(b, seq.tolist(), i) for i, (_, b) in enumerate(shapes)]
    sms = [slots_of(bt, b, qsl.tolist(), seq.tolist()) for bt, (_, b) in zip(bts, shapes)]
    return builders, shapes, qsl, seq, bts, sms


def test_each_group_equals_its_own_build():
    builders, shapes, qsl, seq, bts, sms = three_groups()
    replay = [None, np.array([3, 0, 2], np.int32), None]
    mds = sparse_swa.MetadataBuilder.build_groups(builders, qsl, seq, bts, sms,
                                                  replay_starts=replay)
    assert len(mds) == 3
    for g, (w, b) in enumerate(shapes):
        alone = sparse_swa.MetadataBuilder(group_config(w, b)).build(
            qsl, seq, bts[g], sms[g], replay_start=replay[g])
        assert mds[g].decode_swa_width == w
        for name in ("decode_swa_indices", "decode_swa_lens", "prefill_swa_indices",
                     "prefill_swa_lens", "prefill_gather_lens", "token_to_req_indices",
                     "is_valid_token", "replay_start"):
            np.testing.assert_array_equal(getattr(mds[g], name), getattr(alone, name), name)
        assert mds[g].block_table is bts[g] and mds[g].slot_mapping is sms[g]
    assert mds[1].replay_start.tolist() == [3, 0, 2]
    # Each result is its builder's last build: that builder's draft update takes it.
    seq += 1
    builders[1].update_draft_decode_metadata(mds[1])
    assert mds[1].is_current


def test_errors_name_the_argument_and_write_nothing():
    builders, shapes, qsl, seq, bts, sms = three_groups()
    mds = sparse_swa.MetadataBuilder.build_groups(builders, qsl, seq, bts, sms)
    before = [md.decode_swa_indices.copy() for md in mds]
    with pytest.raises(ValueError, match=r"^block_tables: expected one entry per builder \(3\), got 2"):
        sparse_swa.MetadataBuilder.build_groups(builders, qsl, seq, bts[:2], sms)
    with pytest.raises(ValueError, match=r"^builders: expected 1\.\.8 builders, got 0"):
        sparse_swa.MetadataBuilder.build_groups([], qsl, seq, [], [])
    with pytest.raises(ValueError, match=r"^builders\[1\]: expected a MetadataBuilder"):
        sparse_swa.MetadataBuilder.build_groups([builders[0], "x"], qsl, seq, bts[:2], sms[:2])
    with pytest.raises(ValueError, match=r"^builders\[2\]: expected distinct builders"):
        sparse_swa.MetadataBuilder.build_groups([builders[0], builders[1], builders[0]], qsl,
                                                seq, [bts[0], bts[1], bts[0]], sms)
    with pytest.raises(ValueError, match=r"^replay_starts\[1\]: expected dtype int32"):
        sparse_swa.MetadataBuilder.build_groups(builders, qsl, seq, bts, sms,
                                                replay_starts=[None, np.zeros(3), None])
    bad = bts[2].copy()
    bad[2, :] = -1  # every page of request 2 freed: its prefill windows read them
    with pytest.raises(ValueError, match=r"^batches\[2\]: block_table\[2\]\[0\]: expected a block id >= 0"):
        sparse_swa.MetadataBuilder.build_groups(builders, qsl, seq, [bts[0], bts[1], bad], sms)
    for md, rows in zip(mds, before):
        np.testing.assert_array_equal(md.decode_swa_indices, rows)
