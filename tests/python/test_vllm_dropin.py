# SPDX-License-Identifier: Apache-2.0
"""The vLLM drop-in's glue without vLLM or torch (sparse_swa.integrations.vllm): the config read
from vLLM's objects, the build arguments taken from the common attention metadata, the metadata's
field names and values (equal to sparse_swa.MetadataBuilder's), the draft update and the
one-build-per-step sharing across KV-cache groups. Host numpy arrays stand in for the tensors;
tests/python/test_vllm_integration.py compares against vLLM's own builder."""

import dataclasses
import random
from types import SimpleNamespace as NS

import numpy as np
import pytest

import sparse_swa
from conftest import batch_arrays, image_spans, load_case
from sparse_swa.integrations import vllm as dropin
from test_random_batches import random_batch, random_config

# vLLM 0.33's DeepseekSparseSWAMetadata fields, in order (docs/semantics.md#output-fields).
FIELDS = [
    "block_table", "slot_mapping", "block_size", "seq_lens", "query_start_loc",
    "query_start_loc_cpu", "is_valid_token", "token_to_req_indices", "decode_swa_indices",
    "decode_swa_lens", "decode_swa_width", "prefill_swa_indices", "prefill_swa_lens",
    "prefill_left_visible", "prefill_right_visible", "replay_start", "cache_slot_mapping",
    "cache_positions", "num_decodes", "num_prefills", "num_decode_tokens", "num_prefill_tokens",
    "max_decode_query_len", "flashinfer_decode_topk_lens", "flashinfer_decode_seq_lens",
    "prefill_seq_lens", "prefill_seq_lens_cpu", "prefill_gather_lens", "prefill_query_lens_cpu",
    "prefill_window_size", "prefill_max_model_len", "prefill_max_num_batched_tokens",
    "tile_sched_swaonly", "tile_sched_c4a", "tile_sched_c128a", "tile_sched_c1a",
    "tile_sched_c2a", "flashinfer_sparse_index_cache",
]
# The fields vLLM 0.33 added to the seed's (None on a plain V4 build, but replay_start).
NEW_FIELDS = {"replay_start", "cache_slot_mapping", "cache_positions",
              "flashinfer_decode_topk_lens", "flashinfer_decode_seq_lens"}
INT_FIELDS = {"block_size", "decode_swa_width", "num_decodes", "num_prefills",
              "num_decode_tokens", "num_prefill_tokens", "max_decode_query_len",
              "prefill_window_size", "prefill_max_model_len", "prefill_max_num_batched_tokens"}


def vllm_objects(cfg):
    """(kv_cache_spec, vllm_config) carrying cfg the way vLLM's objects carry it."""
    method = cfg.get("speculative_method", "none")
    spec = None
    if method != "none":
        spec = NS(num_speculative_tokens=cfg.get("num_speculative_tokens", 0),
                  parallel_drafting=cfg.get("parallel_drafting", False),
                  use_dspark=lambda: method == "dspark")
    mi = cfg.get("max_image_tokens", 0)
    hf = NS(sliding_window=cfg["window_size"], compress_ratios=cfg.get("compress_ratios"),
            vision_max_n_token=mi, vision_n_layers=1 if mi else 0)
    vc = NS(model_config=NS(max_model_len=cfg["max_model_len"], hf_config=hf),
            scheduler_config=NS(max_num_batched_tokens=cfg["max_num_batched_tokens"],
                                max_num_seqs=cfg["max_num_seqs"]),
            speculative_config=spec)
    return NS(block_size=cfg["block_size"], head_size=512), vc


def common(arrays, causal=True, spans=None):
    """A CommonAttentionMetadata stand-in over host arrays (host copies are the same arrays)."""
    qsl, seq, bt, slots = arrays
    qlens = np.diff(qsl)
    return NS(query_start_loc=qsl, query_start_loc_cpu=qsl, seq_lens=seq,
              seq_lens_cpu_upper_bound=seq, block_table_tensor=bt, slot_mapping=slots,
              causal=causal, mm_req_doc_ranges=spans or {}, num_reqs=len(qlens),
              num_actual_tokens=len(slots), max_query_len=int(qlens.max(initial=0)))


def make(cfg):
    kv, vc = vllm_objects(cfg)
    return dropin.SparseSWAMetadataBuilder(kv, ["layer.0"], vc, "cpu")


# The batch's own arrays, handed through: field -> the common metadata's attribute.
PASSED = {"block_table": "block_table_tensor", "slot_mapping": "slot_mapping",
          "seq_lens": "seq_lens", "query_start_loc": "query_start_loc",
          "query_start_loc_cpu": "query_start_loc_cpu"}


def assert_equals_plain(md, plain, cm):
    assert isinstance(md, dropin.SparseSWAMetadata)
    for name in FIELDS:
        ours = getattr(md, name)
        if name in PASSED:
            assert ours is getattr(cm, PASSED[name]), name
        elif name.startswith("tile_sched_"):
            layer_type = name[len("tile_sched_"):]  # without vLLM: the layer type's name
            assert ours == (layer_type if layer_type in plain.tile_schedulers else None), name
        elif name == "flashinfer_sparse_index_cache":
            assert ours == {}
        elif name == "replay_start":  # none given: zeros [max_num_seqs + 1]
            assert ours.dtype == np.int32 and not ours.any(), name
        elif name in NEW_FIELDS:
            assert ours is None, name
        elif name in INT_FIELDS:
            assert type(ours) is int and ours == getattr(plain, name), name
        else:
            want = getattr(plain, name)
            assert (ours is None) == (want is None), name
            if want is not None:
                np.testing.assert_array_equal(ours, want, err_msg=name)


def test_metadata_has_the_field_names_and_defaults_of_vllms():
    assert [f.name for f in dataclasses.fields(dropin.SparseSWAMetadata)] == FIELDS
    md = dropin.SparseSWAMetadata(block_table=None, slot_mapping=None, block_size=64)
    assert md.max_decode_query_len == 1 and md.decode_swa_indices is None
    assert md.flashinfer_sparse_index_cache == {}
    assert md.get_prefill_chunk_plan(4, 4) == []  # no prefills
    md.num_prefills = 1
    with pytest.raises(ValueError, match="metadata: expected metadata returned by"):
        md.get_prefill_chunk_plan(4, 4)


@pytest.mark.parametrize("name", ["mixed_mtp", "dspark_draft"])
def test_config_is_read_from_vllms_objects(name):
    cfg = load_case(name)["config"]
    kv, vc = vllm_objects(cfg)
    got = dropin.builder_config(kv, vc)
    full = sparse_swa.BuilderConfig.from_dict(cfg).to_dict()
    for key, value in got.items():
        assert value == (sorted(set(full[key]) or {1}) if key == "compress_ratios"
                         else full[key]), key
    b = make(cfg)
    assert b.decode_threshold == sparse_swa.MetadataBuilder(cfg).decode_threshold
    assert (b.window_size, b.block_size, b.reorder_batch_threshold) == (
        cfg["window_size"], cfg["block_size"], None)
    assert b.is_dspark == (cfg.get("speculative_method") == "dspark")


def test_config_maps_ratio_zero_and_no_speculation():
    cfg = {"window_size": 128, "block_size": 64, "max_num_batched_tokens": 64,
           "max_num_seqs": 4, "max_model_len": 1024, "compress_ratios": [0, 4, 128]}
    kv, vc = vllm_objects(cfg)
    got = dropin.builder_config(kv, vc)
    assert got["compress_ratios"] == [1, 4, 128]  # vLLM: a ratio <= 1 is an SWA-only layer
    assert (got["speculative_method"], got["num_speculative_tokens"]) == ("none", 0)
    vc.model_config.hf_config.compress_ratios = None
    assert dropin.builder_config(kv, vc)["compress_ratios"] == [1]
    vc.model_config.hf_config.compress_ratios = [3]
    with pytest.raises(ValueError, match="compress_ratios"):
        dropin.SparseSWAMetadataBuilder(kv, ["l"], vc, "cpu")


@pytest.mark.parametrize("name", ["mixed_mtp", "dspark_draft"])
def test_build_equals_the_plain_builder_on_the_examples(name):
    case = load_case(name)
    b = case["batch"]
    arrays = batch_arrays(b)
    kw = {"causal": b.get("causal", True), "image_spans": image_spans(b)}
    plain = sparse_swa.MetadataBuilder(case["config"]).build(*arrays, **kw)
    cm = common(arrays, kw["causal"], kw["image_spans"])
    md = make(case["config"]).build(0, cm)
    assert_equals_plain(md, plain, cm)
    for ratio in (1, 4, 128):
        assert md.get_prefill_chunk_plan(ratio, 4) == plain.get_prefill_chunk_plan(ratio, 4)


def test_build_equals_the_plain_builder_on_random_batches():
    rng = random.Random(12)
    for _ in range(40):
        config, theta = random_config(rng)
        ours, plain_builder = make(config), sparse_swa.MetadataBuilder(config)
        for _ in range(3):
            arrays, causal = random_batch(rng, config, theta)
            plain = plain_builder.build(*arrays, causal=causal)
            cm = common(arrays, causal)
            assert_equals_plain(ours.build(0, cm), plain, cm)


def test_max_decode_query_len_is_the_batch_max_capped_by_the_threshold():
    case = load_case("mixed_mtp")  # decode threshold 2, a prefill of 4 tokens
    cm = common(batch_arrays(case["batch"]))
    assert make(case["config"]).build(0, cm).max_decode_query_len == 2
    cm.max_query_len = 1
    assert make(case["config"]).build(0, cm).max_decode_query_len == 1


def test_chunk_plan_after_the_next_build_raises():
    case = load_case("mixed_mtp")
    b = make(case["config"])
    md = b.build(0, common(batch_arrays(case["batch"])))
    b.build(0, common(batch_arrays(case["batch"])))
    with pytest.raises(ValueError, match="metadata"):
        md.get_prefill_chunk_plan(4, 4)


def test_draft_update_equals_the_plain_builders():
    case = load_case("dspark_draft")
    arrays = batch_arrays(case["batch"])
    plain_builder = sparse_swa.MetadataBuilder(case["config"])
    plain = plain_builder.build(*arrays, causal=False)
    ours_arrays = [a.copy() for a in arrays]
    b = make(case["config"])
    md = b.build(0, common(ours_arrays, causal=False))
    md.flashinfer_sparse_index_cache["layer.0"] = "stale"
    first_sched = md.tile_sched_swaonly
    arrays[1][:] += 1
    ours_arrays[1][:] += 1  # the engine advances seq_lens in place
    plain_builder.update_draft_decode_metadata(plain)
    b.update_draft_decode_metadata(md)
    np.testing.assert_array_equal(md.decode_swa_indices, plain.decode_swa_indices)
    np.testing.assert_array_equal(md.decode_swa_lens, plain.decode_swa_lens)
    # Still non-causal (W = 8): prefix 11 and 3 after the advance, lens min(prefix, W) + ql 3.
    assert md.decode_swa_lens.tolist() == [11, 11, 11, 6, 6, 6]
    assert md.flashinfer_sparse_index_cache == {} and first_sched == md.tile_sched_swaonly


def test_groups_sharing_window_and_block_size_share_one_build():
    case = load_case("mixed_mtp")
    cfg = case["config"]
    wide = dict(cfg, window_size=cfg["window_size"] * 2)
    shared = dropin.SharedSWAMetadataBuilds()
    kv, vc = vllm_objects(cfg)
    first = shared.add_group("a", kv, ["l0", "l2"], vc, "cpu")
    assert shared.add_group("b", kv, ["l1"], vc, "cpu") is first
    wide_kv, wide_vc = vllm_objects(wide)
    assert shared.add_group("w", wide_kv, ["l3"], wide_vc, "cpu") is not first
    assert shared.num_builders == 2 and first.layer_names == ["l0", "l2", "l1"]
    cm = common(batch_arrays(case["batch"]))
    out = shared.build(0, {"a": cm, "b": cm, "w": cm})
    assert out["a"] is out["b"] and out["w"] is not out["a"]
    assert out["w"].decode_swa_width == 2 * out["a"].decode_swa_width
    assert_equals_plain(out["a"], sparse_swa.MetadataBuilder(cfg).build(*batch_arrays(
        case["batch"])), cm)
    # The same arrays in another metadata object are the same batch; a copy is not.
    same = NS(**vars(cm))
    assert shared.build(0, {"a": cm, "b": same})["b"] is not None
    other = NS(**dict(vars(cm), block_table_tensor=cm.block_table_tensor.copy()))
    with pytest.raises(ValueError, match=r"group_metadata\['b'\].block_table_tensor: expected "
                                         r"the batch of group 'a'"):
        shared.build(0, {"a": cm, "b": other})


def test_group_errors_name_the_group():
    cfg = load_case("mixed_mtp")["config"]
    shared = dropin.SharedSWAMetadataBuilds()
    kv, vc = vllm_objects(cfg)
    shared.add_group(0, kv, ["l0"], vc, "cpu")
    with pytest.raises(ValueError, match="group_id: expected a new group, got 0 again"):
        shared.add_group(0, kv, ["l0"], vc, "cpu")
    _, longer = vllm_objects(dict(cfg, max_model_len=cfg["max_model_len"] * 2))
    with pytest.raises(ValueError, match="of group 1: expected the configuration .* got a "
                                         "different max_model_len"):
        shared.add_group(1, kv, ["l1"], longer, "cpu")
    with pytest.raises(ValueError, match="group_metadata: expected groups added with "
                                         "add_group\\(\\), got 7"):
        shared.build(0, {7: common(batch_arrays(load_case("mixed_mtp")["batch"]))})


# ---------------------------------------------------------------- vLLM 0.33's rules
def test_compress_ratios_follow_vllms_get_compress_ratios():
    rates = {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128}
    upstream = NS(compress_rates=rates, num_nextn_predict_layers=2, layer_types=[
        "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"])
    assert dropin.compress_ratios(upstream) == [0, 4, 128, 0, 0]  # MTP layers: sliding
    legacy = NS(compress_ratios=[1, 4], compress_rates=rates, layer_types=["x"])
    assert dropin.compress_ratios(legacy) == [1, 4]  # compress_ratios wins
    assert dropin.compress_ratios(NS()) == []
    cfg = load_case("mixed_mtp")["config"]
    kv, vc = vllm_objects(cfg)
    vc.model_config.hf_config = NS(sliding_window=cfg["window_size"], **vars(upstream))
    builder = dropin.SparseSWAMetadataBuilder(kv, ["l"], vc, "cpu")
    assert builder._layer_types == {"swaonly", "c4a", "c128a"}
    assert builder.sparse_swa_config["compress_ratios"] == [1, 4, 128]
    md = builder.build(0, common(batch_arrays(load_case("mixed_mtp")["batch"])))
    assert (md.tile_sched_c4a, md.tile_sched_c128a, md.tile_sched_c1a) == ("c4a", "c128a", None)


def test_deepseek_v41_layer_types():
    cfg = load_case("mixed_mtp")["config"]
    kv, vc = vllm_objects(cfg)
    hf = vc.model_config.hf_config
    for ratios, types in (([0, 1, 2, 0], {"swaonly", "c1a", "c2a"}), (None, {"swaonly"}),
                          ([1], {"c1a"})):
        hf.compress_ratios = ratios
        assert dropin.SparseSWAV41MetadataBuilder(kv, ["l"], vc, "cpu")._layer_types == types
    hf.compress_ratios = [0, 4]
    with pytest.raises(ValueError, match=r"hf_config.compress_ratios\[1\]: expected 0, 1 or 2 "
                                         r"\(DeepSeek-V4.1\), got 4"):
        dropin.SparseSWAV41MetadataBuilder(kv, ["l"], vc, "cpu")


@pytest.mark.parametrize("k, parallel, runner_v2, want", [
    (None, False, False, 1), (0, False, False, 1), (3, False, False, 4), (3, True, False, 7),
    (3, True, True, 4), (3, False, True, 4)])
def test_decode_threshold_follows_the_model_runner(k, parallel, runner_v2, want):
    cfg = {"window_size": 64, "block_size": 16, "max_num_batched_tokens": 64, "max_num_seqs": 8,
           "max_model_len": 1024, "speculative_method": "mtp", "num_speculative_tokens": k or 0,
           "parallel_drafting": parallel}
    kv, vc = vllm_objects(cfg)
    vc.speculative_config.num_speculative_tokens = k
    vc.use_v2_model_runner = runner_v2
    assert dropin.SparseSWAMetadataBuilder(kv, ["l"], vc, "cpu").decode_threshold == want


def test_without_a_vision_gate_any_vision_config_widens():
    # No vLLM here: as the seed's builder, vision layers alone widen the prefill rows.
    case = load_case("vision_prefill")
    kv, vc = vllm_objects(case["config"])
    b = dropin.SparseSWAMetadataBuilder(kv, ["l"], vc, "cpu")
    assert b.prefill_index_width == case["config"]["window_size"] + b.max_image_tokens > 8


def test_replay_start_defaults_to_a_zero_buffer_of_max_num_seqs_plus_one():
    case = load_case("mixed_mtp")
    b = make(case["config"])
    arrays = batch_arrays(case["batch"])
    md = b.build(0, common(arrays))
    assert md.replay_start.shape == (case["config"]["max_num_seqs"] + 1,)
    assert md.replay_start is b.no_replay_start and not md.replay_start.any()
    given = np.zeros(len(arrays[1]), dtype=np.int32)
    assert b.build(0, common(arrays), replay_start=given).replay_start is given


@pytest.mark.skipif(hasattr(sparse_swa.SwaMetadata, "replay_start"),
                    reason="this sparse_swa build has bounded replay")
def test_non_zero_replay_start_without_bounded_replay_is_refused():
    case = load_case("mixed_mtp")
    with pytest.raises(ValueError, match=r"replay_start: expected zeros \(this sparse_swa build "
                                         r"has no bounded replay.*got \[0, 0, 1\]"):
        make(case["config"]).build(0, common(batch_arrays(case["batch"])),
                                   replay_start=np.array([0, 0, 1], dtype=np.int32))


@pytest.mark.skipif(not hasattr(sparse_swa.SwaMetadata, "replay_start"),
                    reason="this sparse_swa build has no bounded replay (SwaMetadata has no "
                           "replay_start)")
def test_replay_start_reaches_the_builder():
    case = load_case("mixed_mtp")  # request 2: a prefill of 4 tokens after a prefix of 6
    arrays = batch_arrays(case["batch"])
    rs = np.array([0, 0, 5], dtype=np.int32)
    plain = sparse_swa.MetadataBuilder(case["config"]).build(*arrays, replay_start=rs)
    md = make(case["config"]).build(0, common(arrays), replay_start=rs)
    np.testing.assert_array_equal(md.prefill_swa_lens, plain.prefill_swa_lens)
    np.testing.assert_array_equal(md.prefill_gather_lens, plain.prefill_gather_lens)
    assert md.replay_start is rs and md.prefill_swa_lens.max() <= 5


def test_v41_flashinfer_fills_the_per_token_decode_lens_on_non_causal_steps():
    case = load_case("dspark_draft")
    kv, vc = vllm_objects(case["config"])
    vc.model_config.hf_config.compress_ratios = [0]
    b = dropin.SparseSWAV41FlashInferMetadataBuilder(kv, ["l"], vc, "cpu")
    arrays = batch_arrays(case["batch"])
    md = b.build(0, common(arrays, causal=False))
    W, td = case["config"]["window_size"], md.num_decode_tokens
    np.testing.assert_array_equal(md.flashinfer_decode_topk_lens,
                                  np.maximum(md.decode_swa_lens, W))
    np.testing.assert_array_equal(md.flashinfer_decode_seq_lens,
                                  arrays[1][md.token_to_req_indices[:td]])
    assert md.flashinfer_decode_seq_lens.dtype == np.int32 and len(md.flashinfer_decode_seq_lens) == td
    arrays[1][:] += 1  # the next draft step: lens refreshed with the rows
    b.update_draft_decode_metadata(md)
    np.testing.assert_array_equal(md.flashinfer_decode_seq_lens,
                                  arrays[1][md.token_to_req_indices[:td]])
    np.testing.assert_array_equal(md.flashinfer_decode_topk_lens,
                                  np.maximum(md.decode_swa_lens, W))
    assert b.build(0, common(arrays)).flashinfer_decode_topk_lens is None  # causal: none
    plain = dropin.SparseSWAFlashInferMetadataBuilder(kv, ["l"], vc, "cpu")  # V4's: none
    assert plain.build(0, common(arrays, causal=False)).flashinfer_decode_topk_lens is None


class FakePcpGroup:
    rank_in_group = 1

    def all_gather(self, x, dim=0):
        return np.concatenate([x - 100, x])


def test_v41_under_pcp_builds_with_this_ranks_slots(monkeypatch):
    case = load_case("mixed_mtp")
    kv, vc = vllm_objects(case["config"])
    vc.model_config.hf_config.compress_ratios = [0, 1]
    vc.parallel_config = NS(prefill_context_parallel_size=2)
    monkeypatch.setattr(dropin.builder._vllm, "pcp_group", FakePcpGroup)
    b = dropin.SparseSWAV41FlashMLAMetadataBuilder(kv, ["l"], vc, "cpu")
    assert (b.pcp_size, b.pcp_rank) == (2, 1)
    qsl, seq, bt, slots = batch_arrays(case["batch"])
    gathered = np.concatenate([np.full_like(slots, 999), slots])  # rank 0's share first
    positions = np.arange(len(slots))
    cm = common((qsl, seq, bt, gathered))
    cm.positions = positions
    md = b.build(0, cm)
    np.testing.assert_array_equal(md.slot_mapping, slots)
    assert md.cache_slot_mapping is gathered
    np.testing.assert_array_equal(md.cache_positions, np.concatenate([positions - 100, positions]))
    np.testing.assert_array_equal(md.is_valid_token, slots >= 0)
    assert md.replay_start.shape == (2 * case["config"]["max_num_seqs"] + 1,)
    cm.positions = None
    with pytest.raises(ValueError, match="common_attn_metadata.positions: expected the step's "
                                         "positions under prefill context parallelism"):
        b.build(0, cm)
    no_pcp = dropin.SparseSWAFlashMLAMetadataBuilder(kv, ["l"], vc, "cpu")  # V4: no PCP
    assert no_pcp.pcp_size == 1 and no_pcp.build(0, common((qsl, seq, bt, slots))
                                                 ).cache_slot_mapping is None


def test_no_plan_holders_on_a_platform_without_flashmla_decode(monkeypatch):
    cpu = NS(is_rocm=lambda: False, is_xpu=lambda: False, is_cpu=lambda: True,
             is_device_capability_family=lambda f: False)
    monkeypatch.setattr(dropin.builder._vllm, "platform", lambda: cpu)
    case = load_case("mixed_mtp")
    md = make(case["config"]).build(0, common(batch_arrays(case["batch"])))
    assert md.num_decode_tokens and all(getattr(md, f"tile_sched_{t}") is None
                                        for t in dropin.LAYER_TYPES)


def test_shared_builds_take_each_groups_replay_start():
    case = load_case("mixed_mtp")
    shared = dropin.SharedSWAMetadataBuilds()
    kv, vc = vllm_objects(case["config"])
    vc.model_config.hf_config.compress_ratios = [0, 1, 2]
    for gid in ("a", "b"):
        shared.add_group(gid, kv, [f"l.{gid}"], vc, "cpu",
                         builder_cls=dropin.SparseSWAV41FlashMLAMetadataBuilder)
    v4 = shared.add_group("v4", kv, ["l.v4"], vc, "cpu")
    assert shared.num_builders == 2 and type(v4) is dropin.SparseSWAMetadataBuilder
    cm = common(batch_arrays(case["batch"]))
    rs = np.zeros(3, dtype=np.int32)
    out = shared.build(0, {"a": cm, "b": cm, "v4": cm}, replay_start={"a": rs, "b": rs})
    assert out["a"] is out["b"] and out["a"].replay_start is rs
    assert out["v4"].replay_start is not rs and out["a"].tile_sched_c1a == "c1a"
    with pytest.raises(ValueError, match=r"group_metadata\['b'\].replay_start: expected the "
                                         r"batch of group 'a'"):
        shared.build(0, {"a": cm, "b": cm}, replay_start={"a": rs})
