# SPDX-License-Identifier: Apache-2.0
"""Shared helpers for the sparse_swa Python tests (numpy on the CPU backend)."""

import json
from pathlib import Path

import numpy as np
import pytest

import sparse_swa

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "batches"


def load_case(name):
    return json.loads((EXAMPLES / f"{name}.json").read_text())


def batch_arrays(batch):
    """The four batch arrays of a JSON batch, with the dtypes the builder takes."""
    return (
        np.array(batch["query_start_loc"], dtype=np.int32),
        np.array(batch["seq_lens"], dtype=np.int32),
        np.array(batch["block_table"], dtype=np.int32).reshape(len(batch["block_table"]), -1),
        np.array(batch["slot_mapping"], dtype=np.int64),
    )


def image_spans(batch):
    spans = batch.get("image_spans")
    if not spans:
        return None
    return {int(r): [tuple(s) for s in v] for r, v in spans.items()}


def build_case(builder, case):
    b = case["batch"]
    replay = b.get("replay_start")
    return builder.build(*batch_arrays(b), causal=b.get("causal", True),
                         image_spans=image_spans(b),
                         replay_start=None if replay is None else np.array(replay, np.int32))


@pytest.fixture
def mixed_case():
    return load_case("mixed_mtp")


@pytest.fixture
def mixed_builder(mixed_case):
    return sparse_swa.MetadataBuilder(mixed_case["config"])


def slot(block_table_row, block_size, pos):
    return int(block_table_row[pos // block_size]) * block_size + pos % block_size
