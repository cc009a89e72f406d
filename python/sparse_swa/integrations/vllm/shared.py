# SPDX-License-Identifier: Apache-2.0
"""SharedSWAMetadataBuilds: one build per step for the KV-cache groups that share a window,
block size and device (DeepSeek-V4.1 runs three SWA groups)."""

from __future__ import annotations

from typing import Any, Mapping

from .builder import SparseSWAMetadataBuilder
from .config import builder_config
from .metadata import SparseSWAMetadata

# The batch fields two KV-cache groups must share to share one build.
_BATCH_FIELDS = ("query_start_loc", "seq_lens", "block_table_tensor", "slot_mapping")


def _same_tensor(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        return (a.data_ptr() == b.data_ptr() and a.device == b.device and a.dtype == b.dtype
                and tuple(a.shape) == tuple(b.shape) and tuple(a.stride()) == tuple(b.stride()))
    except AttributeError:
        return False


def _batch_difference(a: Any, b: Any) -> str | None:
    """The first field in which two groups' common metadata differ, or None."""
    for name in _BATCH_FIELDS:
        if not _same_tensor(getattr(a, name), getattr(b, name)):
            return name
    for name in ("causal", "num_actual_tokens", "num_reqs", "max_query_len"):
        if getattr(a, name, None) != getattr(b, name, None):
            return name
    return None


class SharedSWAMetadataBuilds:
    """One builder per (builder class, window, block size, device) for all the KV-cache groups
    that share them, and one build per step for all of them: each group gets the same metadata.

        shared = SharedSWAMetadataBuilds()
        for gid, (spec, layers) in groups.items():
            shared.add_group(gid, spec, layers, vllm_config, device)
        per_group = shared.build(common_prefix_len, {gid: common_attn_metadata, ...},
                                 replay_start={gid: replay_start, ...})

    Groups of one key must hand in the same batch (the same query_start_loc, seq_lens,
    block_table_tensor and slot_mapping tensors, or views of the same memory) and the same
    replay_start; a group that differs raises ValueError naming it and the field.
    """

    def __init__(self) -> None:
        self._builders: dict[tuple, SparseSWAMetadataBuilder] = {}
        self._key_of: dict[Any, tuple] = {}

    def add_group(self, group_id: Any, kv_cache_spec: Any, layer_names: list[str],
                  vllm_config: Any, device: Any,
                  builder_cls: type[SparseSWAMetadataBuilder] = SparseSWAMetadataBuilder,
                  ) -> SparseSWAMetadataBuilder:
        """Registers a KV-cache group; returns the builder it shares (made at the first group
        of its key). ValueError when a group of the same key has another configuration."""
        if group_id in self._key_of:
            raise ValueError(f"group_id: expected a new group, got {group_id!r} again")
        config = builder_config(kv_cache_spec, vllm_config,
                                flashinfer_decode_lens=builder_cls.flashinfer_decode_lens)
        key = (builder_cls, config["window_size"], config["block_size"], str(device))
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
        """{group_id: metadata} for the given groups, one build per key. replay_start:
        {group_id: [R] int32} for the groups that replay (absent: none)."""
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
                    f"{first[0]!r}, which shares its window and block size, got another")
        built = self._build_keys(common_prefix_len, firsts, fast_build)
        return {gid: built[self._key_of[gid]] for gid in group_metadata}

    def _build_keys(self, common_prefix_len: int, firsts: Mapping[tuple, tuple[Any, Any, Any]],
                    fast_build: bool) -> dict[tuple, SparseSWAMetadata]:
        """One metadata per key: one build() per builder (the seam for a build of all keys in
        one launch)."""
        return {key: self._builders[key].build(common_prefix_len, cm, fast_build, rs)
                for key, (_, cm, rs) in firsts.items()}
