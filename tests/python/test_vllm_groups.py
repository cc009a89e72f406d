# SPDX-License-Identifier: Apache-2.0
"""SharedSWAMetadataBuilds over KV-cache groups that differ in window, block size or block
table: every key of a step built by one MetadataBuilder.build_groups call, each group's metadata
equal, field for field, to its own builder's build() (replay_start, FlashInfer lens, PCP
pass-throughs and plan holders included); the fallbacks to separate builds; errors naming the
group. Host numpy arrays (CPU backend); the torch form at the end skips without torch and runs
on CUDA tensors where there is a GPU."""

import dataclasses
from types import SimpleNamespace as NS

import numpy as np
import pytest

import sparse_swa
from conftest import batch_arrays, load_case
from sparse_swa.integrations import vllm as dropin
from test_vllm_dropin import common, vllm_objects

pytestmark = pytest.mark.skipif(not hasattr(sparse_swa.MetadataBuilder, "build_groups"),
                                reason="this sparse_swa build has no MetadataBuilder.build_groups")
FIELDS = [f.name for f in dataclasses.fields(dropin.SparseSWAMetadata)]


def block_table(block, seq, seed):
    """Random page ids for `block`-token pages, enough columns for every request."""
    rng = np.random.default_rng(seed)
    cols = max(-(-s // block) for s in seq)
    return rng.permutation(64)[:len(seq) * cols].reshape(len(seq), cols).astype(np.int32)


def slots_of(bt, block, qsl, seq):
    return np.array([int(bt[r][p // block]) * block + p % block
                     for r in range(len(seq)) for p in range(seq[r] - (qsl[r + 1] - qsl[r]),
                                                            seq[r])], np.int64)


# (group id, window, block size): "b" shares "a"'s window and block size, not its block table.
SHAPES = [("a", 8, 4), ("b", 8, 4), ("w", 16, 2)]


def groups(cls=dropin.SparseSWAMetadataBuilder, name="mixed_mtp", causal=True, shapes=SHAPES,
           hf=None, parallel=None):
    """(shared builds, {gid: its common metadata}, {gid: a separate builder of the same
    config}); the groups share query_start_loc and seq_lens, each has its own block table."""
    case = load_case(name)
    qsl, seq, _, _ = batch_arrays(case["batch"])
    shared, cms, alone = dropin.SharedSWAMetadataBuilds(), {}, {}
    for i, (gid, window, block) in enumerate(shapes):
        kv, vc = vllm_objects(dict(case["config"], window_size=window, block_size=block))
        vc.model_config.hf_config.__dict__.update(hf or {})
        if parallel is not None:
            vc.parallel_config = parallel
        shared.add_group(gid, kv, [f"l.{gid}"], vc, "cpu", builder_cls=cls, own_batch=True)
        alone[gid] = cls(kv, [f"l.{gid}"], vc, "cpu")
        bt = block_table(block, seq.tolist(), i)
        cms[gid] = common((qsl, seq, bt, slots_of(bt, block, qsl.tolist(), seq.tolist())),
                          causal=causal)
    return shared, cms, alone


class CountingBuildGroups:
    """sparse_swa as shared.py sees it, counting build_groups calls and their group counts."""

    def __init__(self):
        self.calls = []
        real = sparse_swa.MetadataBuilder.build_groups

        def build_groups(builders, *args, **kwargs):
            self.calls.append(len(builders))
            return real(builders, *args, **kwargs)

        self.MetadataBuilder = NS(build_groups=build_groups)


@pytest.fixture
def launches(monkeypatch):
    counting = CountingBuildGroups()
    monkeypatch.setattr(dropin.shared, "sparse_swa", counting)
    return counting.calls


def assert_same_metadata(got, want, cm, alone_builder, replay=None):
    """got (from the shared builds) equals want (the separate builder's build()) in every field;
    the batch's own arrays are handed through, replay_start is the caller's or the builder's
    zeros."""
    for name in FIELDS:
        a, b = getattr(got, name), getattr(want, name)
        if name in ("block_table", "slot_mapping", "seq_lens", "query_start_loc",
                    "query_start_loc_cpu"):
            assert a is b, name
        elif name == "replay_start":
            if replay is not None:
                assert a is replay and b is replay
            else:
                assert a is not b and a.shape == b.shape and not a.any() and not b.any()
        elif isinstance(b, np.ndarray):
            assert isinstance(a, np.ndarray) and a.dtype == b.dtype, name
            np.testing.assert_array_equal(a, b, err_msg=name)
        else:
            assert type(a) is type(b) and a == b, name
    assert got.source is not want.source
    assert alone_builder is not None


def build_alone(alone, cms, replay=None):
    replay = replay or {}
    return {g: alone[g].build(0, cms[g], replay_start=replay.get(g)) for g in cms}


def test_three_groups_are_one_launch_and_equal_separate_builds(launches):
    shared, cms, alone = groups()
    out = shared.build(0, cms)
    assert launches == [3] and shared.num_builders == 3
    assert shared.builder("a") is not shared.builder("b")
    want = build_alone(alone, cms)
    for gid in cms:
        assert_same_metadata(out[gid], want[gid], cms[gid], alone[gid])
    assert out["w"].decode_swa_width == 16 and out["a"].decode_swa_width == 8
    # Each group's rows read its own block table: "a" and "b" differ though W and B agree.
    assert not np.array_equal(out["a"].decode_swa_indices, out["b"].decode_swa_indices)
    # Each metadata is its own builder's last build: the draft update takes it.
    cms["a"].seq_lens[:2] += 1  # the groups' one seq_lens array, advanced in place
    for gid in cms:
        shared.builder(gid).update_draft_decode_metadata(out[gid])
        alone[gid].update_draft_decode_metadata(want[gid])
        np.testing.assert_array_equal(out[gid].decode_swa_indices, want[gid].decode_swa_indices)


def test_replay_in_one_group(launches):
    shared, cms, alone = groups()
    rs = np.array([0, 0, 5], np.int32)  # request 2: a prefill of 4 after a prefix of 6
    out = shared.build(0, cms, replay_start={"b": rs})
    want = build_alone(alone, cms, {"b": rs})
    assert launches == [3]
    for gid in cms:
        assert_same_metadata(out[gid], want[gid], cms[gid], alone[gid],
                             replay=rs if gid == "b" else None)
    assert out["b"].replay_start is rs and out["a"].replay_start is shared.builder("a").no_replay_start
    assert out["b"].prefill_swa_lens.max() <= 5 < out["a"].prefill_swa_lens.max()


def test_groups_sharing_a_key_share_one_build_beside_the_others(launches):
    case = load_case("mixed_mtp")
    shared = dropin.SharedSWAMetadataBuilds()
    kv, vc = vllm_objects(case["config"])
    wide_kv, wide_vc = vllm_objects(dict(case["config"], window_size=16))
    first = shared.add_group("a", kv, ["l0"], vc, "cpu")
    assert shared.add_group("a2", kv, ["l1"], vc, "cpu") is first
    own = shared.add_group("own", kv, ["l2"], vc, "cpu", own_batch=True)
    shared.add_group("w", wide_kv, ["l3"], wide_vc, "cpu")
    assert own is not first and shared.num_builders == 3
    cm = common(batch_arrays(case["batch"]))
    out = shared.build(0, {"a": cm, "a2": cm, "own": cm, "w": cm})
    assert launches == [3] and out["a"] is out["a2"] and out["own"] is not out["a"]
    plain = sparse_swa.MetadataBuilder(case["config"]).build(*batch_arrays(case["batch"]))
    for md in (out["a"], out["own"]):
        np.testing.assert_array_equal(md.decode_swa_indices, plain.decode_swa_indices)
        np.testing.assert_array_equal(md.prefill_swa_indices, plain.prefill_swa_indices)
    # A group of the shared key with its own block table: the message says how to add it.
    other = NS(**dict(vars(cm), block_table_tensor=cm.block_table_tensor.copy()))
    with pytest.raises(ValueError, match=r"group_metadata\['a2'\].block_table_tensor: expected "
                                         r"the batch of group 'a'.*own_batch=True"):
        shared.build(0, {"a": cm, "a2": other})


def test_v41_flashinfer_lens_and_plan_holders_per_group(launches):
    shared, cms, alone = groups(dropin.SparseSWAV41FlashInferMetadataBuilder, "dspark_draft",
                                causal=False, hf={"compress_ratios": [0, 1, 2]})
    out = shared.build(0, cms)
    want = build_alone(alone, cms)
    assert launches == [3]
    for gid in cms:
        assert_same_metadata(out[gid], want[gid], cms[gid], alone[gid])
        assert out[gid].flashinfer_decode_topk_lens is not None
        assert out[gid].tile_sched_c1a == "c1a" and out[gid].tile_sched_c4a is None


class FakePcpGroup:
    rank_in_group = 1

    def all_gather(self, x, dim=0):
        return np.concatenate([x - 100, x])


def test_v41_pcp_passes_each_groups_slots_through(monkeypatch, launches):
    monkeypatch.setattr(dropin.builder._vllm, "pcp_group", FakePcpGroup)
    shared, cms, alone = groups(dropin.SparseSWAV41FlashMLAMetadataBuilder,
                                hf={"compress_ratios": [0, 1]},
                                parallel=NS(prefill_context_parallel_size=2))
    own = {}
    for gid, cm in cms.items():  # this rank's slots second, after rank 0's
        own[gid] = cm.slot_mapping
        cm.slot_mapping = np.concatenate([np.full_like(own[gid], 999), own[gid]])
        cm.positions = np.arange(len(own[gid]))
    out = shared.build(0, cms)
    want = build_alone(alone, cms)
    assert launches == [3]
    for gid, cm in cms.items():
        assert out[gid].cache_slot_mapping is cm.slot_mapping
        np.testing.assert_array_equal(out[gid].slot_mapping, own[gid])
        for name in ("cache_positions", "is_valid_token", "decode_swa_indices",
                     "prefill_swa_indices"):
            np.testing.assert_array_equal(getattr(out[gid], name), getattr(want[gid], name))


def test_fallbacks_build_what_build_groups_cannot_take(launches):
    shared, cms, alone = groups()
    # "w" has its own copy of query_start_loc: not the same step, so a separate build.
    cms["w"] = NS(**dict(vars(cms["w"]), query_start_loc=cms["w"].query_start_loc.copy()))
    out = shared.build(0, cms)
    assert launches == [2]
    want = build_alone(alone, cms)
    for gid in cms:
        assert_same_metadata(out[gid], want[gid], cms[gid], alone[gid])
    # A builder class with its own build() is built by it.
    calls = []

    class Custom(dropin.SparseSWAMetadataBuilder):
        def build(self, *args, **kwargs):
            calls.append(self)
            return super().build(*args, **kwargs)

    launches.clear()
    shared, cms, alone = groups(Custom)
    out = shared.build(0, cms)
    assert launches == [] and len(calls) == 3
    # One key alone: one build().
    assert shared.build(0, {"w": cms["w"]})["w"].decode_swa_width == 16 and launches == []


def test_errors_name_the_group_and_write_nothing():
    shared, cms, _ = groups()
    out = shared.build(0, cms)
    before = {g: md.decode_swa_indices.copy() for g, md in out.items()}
    bad = cms["w"].block_table_tensor.copy()
    bad[2, :] = -1  # every page of request 2 freed: its prefill rows read them
    broken = dict(cms, w=NS(**dict(vars(cms["w"]), block_table_tensor=bad)))
    with pytest.raises(ValueError, match=r"^group_metadata\['w'\]: block_table\[2\]\[0\]: "
                                         r"expected a block id >= 0"):
        shared.build(0, broken)
    with pytest.raises(ValueError, match=r"^replay_start\['b'\]: expected dtype int32"):
        shared.build(0, cms, replay_start={"b": np.zeros(3)})
    with pytest.raises(ValueError, match=r"^group_metadata\['a'\]: replay_start\[2\]: expected "
                                         r"<= the request's prefix"):
        shared.build(0, cms, replay_start={"a": np.array([0, 0, 7], np.int32)})  # past prefix 6
    for gid, rows in before.items():
        np.testing.assert_array_equal(out[gid].decode_swa_indices, rows)


def test_same_step_takes_views_of_the_same_memory():
    a = np.arange(8, dtype=np.int32)
    assert dropin.shared._same_tensor(a, a[:]) and not dropin.shared._same_tensor(a, a.copy())
    assert not dropin.shared._same_tensor(a, a[1:]) and not dropin.shared._same_tensor(a, None)


# ---------------------------------------------------------------- torch
def test_torch_groups_equal_separate_builds(launches):
    torch = pytest.importorskip("torch")
    cuda = torch.cuda.is_available() and sparse_swa.cuda_available()
    device = torch.device("cuda" if cuda else "cpu")
    case = load_case("mixed_mtp")
    qsl, seq, _, _ = batch_arrays(case["batch"])
    shared, cms, alone = dropin.SharedSWAMetadataBuilds(), {}, {}
    for i, (gid, window, block) in enumerate(SHAPES):
        kv, vc = vllm_objects(dict(case["config"], window_size=window, block_size=block))
        shared.add_group(gid, kv, [gid], vc, device, own_batch=True)
        alone[gid] = dropin.SparseSWAMetadataBuilder(kv, [gid], vc, device)
        bt = block_table(block, seq.tolist(), i)
        sm = slots_of(bt, block, qsl.tolist(), seq.tolist())
        cms[gid] = (torch.from_numpy(bt).to(device), torch.from_numpy(sm).to(device))
    qsl_d, seq_d = torch.from_numpy(qsl).to(device), torch.from_numpy(seq).to(device)
    qsl_h, seq_h = torch.from_numpy(qsl), torch.from_numpy(seq)
    for gid, (bt, sm) in cms.items():  # per group views of the step's arrays, as vLLM slices
        cms[gid] = NS(query_start_loc=qsl_d[:], query_start_loc_cpu=qsl_h[:], seq_lens=seq_d[:],
                      seq_lens_cpu_upper_bound=seq_h[:], block_table_tensor=bt, slot_mapping=sm,
                      causal=True, mm_req_doc_ranges={}, num_reqs=3, num_actual_tokens=7,
                      max_query_len=4)
    rs = torch.tensor([0, 0, 5], dtype=torch.int32, device=device)
    out = shared.build(0, cms, replay_start={"w": rs})
    want = {g: alone[g].build(0, cms[g], replay_start=rs if g == "w" else None) for g in cms}
    assert launches == [3]
    for gid in cms:
        for name in FIELDS:
            a, b = getattr(out[gid], name), getattr(want[gid], name)
            if isinstance(b, torch.Tensor):
                assert a.device == b.device and a.dtype == b.dtype, name
                assert torch.equal(a.cpu(), b.cpu()), name
            elif not name.startswith("tile_sched_"):
                assert a == b, name
    assert out["w"].replay_start is rs and out["a"].replay_start.device == device
