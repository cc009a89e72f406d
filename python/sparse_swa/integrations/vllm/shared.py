# SPDX-License-Identifier: Apache-2.0
"""SharedSWAMetadataBuilds: one build per step for the KV-cache groups that share a window,
block size and device, and one launch for all of them (DeepSeek-V4.1 runs three SWA groups)."""

from __future__ import annotations

import re
from typing import Any, Mapping

import sparse_swa

from .builder import BuildInputs, SparseSWAMetadataBuilder
from .config import builder_config
from .metadata import SparseSWAMetadata

# The batch fields two KV-cache groups must share to share one build.
_BATCH_FIELDS = ("query_start_loc", "seq_lens", "block_table_tensor", "slot_mapping")
# The most builders one MetadataBuilder.build_groups call takes (kMaxBuildGroups).
_MAX_GROUPS_PER_LAUNCH = 8
_HAS_BUILD_GROUPS = hasattr(sparse_swa.MetadataBuilder, "build_groups")
# build_groups' per-group argument names in its messages -> the drop-in's.
_GROUP_ERROR = re.compile(r"^(batches|replay_starts)\[(\d+)\]: ")


def _same_tensor(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        return (a.data_ptr() == b.data_ptr() and a.device == b.device and a.dtype == b.dtype
                and tuple(a.shape) == tuple(b.shape) and tuple(a.stride()) == tuple(b.stride()))
    except AttributeError:
        pass
    try:  # numpy: the same memory, dtype, shape and strides
        ia, ib = a.__array_interface__, b.__array_interface__
    except AttributeError:
        return False
    return (ia["data"] == ib["data"] and ia["typestr"] == ib["typestr"]
            and ia["shape"] == ib["shape"] and ia.get("strides") == ib.get("strides"))


def _batch_difference(a: Any, b: Any) -> str | None:
    """The first field in which two groups' common metadata differ, or None."""
    for name in _BATCH_FIELDS:
        if not _same_tensor(getattr(a, name), getattr(b, name)):
            return name
    for name in ("causal", "num_actual_tokens", "num_reqs", "max_query_len"):
        if getattr(a, name, None) != getattr(b, name, None):
            return name
    return None


def _same_step(a: tuple[Any, BuildInputs], b: tuple[Any, BuildInputs]) -> bool:
    """Whether two groups' batches agree in all that build_groups takes once for every group
    (all but the block table, the slots and replay_start)."""
    (cm_a, in_a), (cm_b, in_b) = a, b
    return (all(_same_tensor(getattr(cm_a, n), getattr(cm_b, n))
                for n in ("query_start_loc", "seq_lens", "query_start_loc_cpu"))
            and _same_tensor(in_a.seq_lens_cpu, in_b.seq_lens_cpu)
            and in_a.causal == in_b.causal
            and (in_a.spans is in_b.spans or in_a.spans == in_b.spans))


class SharedSWAMetadataBuilds:
    """One builder per (builder class, window, block size, device) for all the KV-cache groups
    that share them and their batch, one build per step for each such key (its groups get the
    same metadata), and one launch for all the keys of a step:

        shared = SharedSWAMetadataBuilds()
        for gid, (spec, layers) in groups.items():
            shared.add_group(gid, spec, layers, vllm_config, device, own_batch=True)
        per_group = shared.build(common_prefix_len, {gid: common_attn_metadata, ...},
                                 replay_start={gid: replay_start, ...})

    Groups of one key must hand in the same batch (the same query_start_loc, seq_lens,
    block_table_tensor and slot_mapping tensors, or views of the same memory) and the same
    replay_start; a group that differs raises ValueError naming it and the field. A group
    added with own_batch=True (its own block table and slots, as each of vLLM's KV-cache groups
    has) gets a builder of its own. The keys built in one step go through one
    sparse_swa.MetadataBuilder.build_groups call (one kernel launch on CUDA) when they share
    the step's query_start_loc, seq_lens and host copies, causality and image spans.
    """

    def __init__(self) -> None:
        self._builders: dict[tuple, SparseSWAMetadataBuilder] = {}
        self._key_of: dict[Any, tuple] = {}

    def add_group(self, group_id: Any, kv_cache_spec: Any, layer_names: list[str],
                  vllm_config: Any, device: Any,
                  builder_cls: type[SparseSWAMetadataBuilder] = SparseSWAMetadataBuilder,
                  own_batch: bool = False) -> SparseSWAMetadataBuilder:
        """Registers a KV-cache group; returns the builder it shares (made at the first group
        of its key), or with own_batch its own. ValueError when a group of the same key has
        another configuration."""
        if group_id in self._key_of:
            raise ValueError(f"group_id: expected a new group, got {group_id!r} again")
        config = builder_config(kv_cache_spec, vllm_config,
                                flashinfer_decode_lens=builder_cls.flashinfer_decode_lens)
        key = (builder_cls, config["window_size"], config["block_size"], str(device))
        if own_batch:  # ("own", group_id) never equals a shared key's last entry, None
            key += (("own", group_id),)
        else:
            key += (None,)
        builder = self._builders.get(key)
        if builder is None:
            builder = builder_cls(kv_cache_spec, list(layer_names), vllm_config, device)
            self._builders[key] = builder
        elif builder.sparse_swa_config != config:
            diff = sorted(k for k in config if config[k] != builder.sparse_swa_config.get(k))
            raise ValueError(f"kv_cache_spec/vllm_config of group {group_id!r}: expected the "
                             f"configuration of the groups with window {key[1]} and block size "
                             f"{key[2]}, got a different {', '.join(diff)}")
        else:
            builder.layer_names = list(builder.layer_names) + list(layer_names)
        self._key_of[group_id] = key
        return builder

    def builder(self, group_id: Any) -> SparseSWAMetadataBuilder:
        return self._builders[self._key_of[group_id]]

    @property
    def num_builders(self) -> int:
        return len(self._builders)

    def build(self, common_prefix_len: int, group_metadata: Mapping[Any, Any],
              fast_build: bool = False, replay_start: Mapping[Any, Any] | None = None,
              ) -> dict[Any, SparseSWAMetadata]:
        """{group_id: metadata} for the given groups, one build per key, the keys in as few
        launches as their batches allow. replay_start: {group_id: [R] int32} for the groups
        that replay (absent: none)."""
        replay = dict(replay_start or {})
        firsts: dict[tuple, tuple[Any, Any, Any]] = {}  # key -> the first group's (gid, cm, rs)
        for gid, cm in group_metadata.items():
            key = self._key_of.get(gid)
            if key is None:
                raise ValueError(f"group_metadata: expected groups added with add_group(), got "
                                 f"{gid!r}")
            first = firsts.setdefault(key, (gid, cm, replay.get(gid)))
            if first[0] == gid:
                continue
            diff = _batch_difference(first[1], cm)
            if diff is None and first[2] is not replay.get(gid):
                diff = "replay_start"
            if diff is not None:
                raise ValueError(
                    f"group_metadata[{gid!r}].{diff}: expected the batch of group "
                    f"{first[0]!r}, which shares its window and block size, got another "
                    f"(add_group(..., own_batch=True) gives a group a builder of its own)")
        built = self._build_keys(common_prefix_len, firsts, fast_build)
        return {gid: built[self._key_of[gid]] for gid in group_metadata}

    def _build_keys(self, common_prefix_len: int, firsts: Mapping[tuple, tuple[Any, Any, Any]],
                    fast_build: bool) -> dict[tuple, SparseSWAMetadata]:
        """One metadata per key. Keys whose batches agree in all but the block table, slots and
        replay_start are built by one MetadataBuilder.build_groups call (one launch on CUDA),
        each wrapped as its builder's build() wraps it. A key goes through its own build()
        instead when build_groups cannot take it: this sparse_swa has no build_groups; its
        builder class overrides build() (its own rules, not to be bypassed); it is the only key
        of its device, or its batch differs from the others' (build_groups takes one
        query_start_loc, seq_lens, host copies, causal and image spans for all groups)."""
        built: dict[tuple, SparseSWAMetadata] = {}
        sets: list[list[tuple]] = []  # keys of one launch, each set of one device and step
        inputs: dict[tuple, BuildInputs] = {}
        for key, (_, cm, rs) in firsts.items():
            b = self._builders[key]
            if not _HAS_BUILD_GROUPS or type(b).build is not SparseSWAMetadataBuilder.build:
                built[key] = b.build(common_prefix_len, cm, fast_build, rs)
                continue
            inputs[key] = b._build_inputs(cm, rs)
            for keys in sets:
                k0 = keys[0]
                if (k0[3] == key[3] and len(keys) < _MAX_GROUPS_PER_LAUNCH
                        and _same_step((firsts[k0][1], inputs[k0]), (cm, inputs[key]))):
                    keys.append(key)
                    break
            else:
                sets.append([key])
        for keys in sets:
            if len(keys) == 1:
                _, cm, rs = firsts[keys[0]]
                built[keys[0]] = self._builders[keys[0]]._build_with(cm, inputs[keys[0]], rs)
            else:
                built.update(self._build_together(keys, firsts, inputs))
        return built

    def _build_together(self, keys: list[tuple], firsts: Mapping[tuple, tuple[Any, Any, Any]],
                        inputs: Mapping[tuple, BuildInputs]) -> dict[tuple, SparseSWAMetadata]:
        """The keys' metadata from one build_groups call; its errors name the group."""
        builders = [self._builders[k] for k in keys]
        cms = [firsts[k][1] for k in keys]
        ins = [inputs[k] for k in keys]
        cm0, in0 = cms[0], ins[0]
        replays = [i.replay for i in ins]
        try:
            mds = sparse_swa.MetadataBuilder.build_groups(
                [b.sparse_swa_builder for b in builders], cm0.query_start_loc, cm0.seq_lens,
                [cm.block_table_tensor for cm in cms], [i.slots for i in ins],
                causal=in0.causal, image_spans=in0.spans,
                query_start_loc_cpu=cm0.query_start_loc_cpu, seq_lens_cpu=in0.seq_lens_cpu,
                replay_starts=None if all(r is None for r in replays) else replays)
        except ValueError as e:
            m = _GROUP_ERROR.match(str(e))
            if m is None:
                raise
            gid = firsts[keys[int(m.group(2))]][0]
            where = "group_metadata" if m.group(1) == "batches" else "replay_start"
            raise ValueError(f"{where}[{gid!r}]: {str(e)[m.end():]}") from None
        return {k: b._wrap(md, cm, i, firsts[k][2])
                for k, b, md, cm, i in zip(keys, builders, mds, cms, ins)}
