# SPDX-License-Identifier: Apache-2.0
"""torch.ops.sparse_swa consumer ops (compressed_topk_to_global, mixed_matrix, combined_prefill)
over the metadata's arrays: equal to the plain functions on an SwaMetadata bit for bit on random
batches (decode, MTP, DSpark, padding, chunked prefill, images; compressed ratios 1, 4 and 128;
both mixed-matrix forms), bounded replay (docs example 6 by hand and random replaying batches:
the ops' replay_start), the SM100 relayout of DSpark rows by hand, errors naming the argument,
fake implementations (opcheck, torch.compile(fullgraph=True)), and on a GPU the CUDA path equal
to the CPU one. Skipped without torch; GPU tests skip without CUDA."""

import random

import numpy as np
import pytest

import sparse_swa
import swa_model
from conftest import batch_arrays, image_spans, load_case
from test_random_batches import random_batch, random_config
from test_replay_consumers import EX6_COMBINED, EX6_DECODE, EX6_PREFILL, replaying_batch

torch = pytest.importorskip("torch")
from sparse_swa import torch_ops  # noqa: E402  registers the ops

ops = torch.ops.sparse_swa
cuda = pytest.mark.skipif(not (torch.cuda.is_available() and sparse_swa.cuda_available()),
                          reason="needs a CUDA GPU and sparse_swa's CUDA backend")
FORMS = ("flashinfer_sm100", "verbatim")
CHUNKED = {"window_size": 32, "block_size": 16, "max_num_batched_tokens": 64,
           "max_num_seqs": 8, "max_model_len": 128}


def build(config, arrays, causal=True, spans=None, device="cpu", replay_start=None):
    """The metadata of a batch built from torch tensors on `device` (a fresh builder);
    replay_start: a numpy [num_reqs] int32 array or None."""
    qsl, seq, bt, slots = (torch.from_numpy(a) for a in arrays)
    kwargs = {}
    if replay_start is not None:
        kwargs["replay_start"] = torch.from_numpy(replay_start).to(device)
    if device != "cpu":
        kwargs.update(query_start_loc_cpu=qsl, seq_lens_cpu=seq)
        qsl, seq, bt, slots = (a.to(device) for a in (qsl, seq, bt, slots))
    builder = sparse_swa.MetadataBuilder(config)
    return builder, builder.build(qsl, seq, bt, slots, causal=causal, image_spans=spans, **kwargs)


def chunked_batch(rng):
    """0-1 decodes then 2-3 prefills of 18-20 tokens with prefixes of 50-100: every request
    needs more than half of the plan's per-request budget, so chunk_size 1 gives several
    chunks for every compress ratio."""
    block = CHUNKED["block_size"]
    qlens = [1] * rng.randint(0, 1) + [rng.randint(18, 20) for _ in range(rng.randint(2, 3))]
    seq = [q + (rng.randint(0, 60) if q == 1 else rng.randint(50, 100)) for q in qlens]
    blocks = -(-max(seq) // block)
    bt = np.array(rng.sample(range(1000), len(seq) * blocks), np.int32).reshape(len(seq), blocks)
    qsl = np.cumsum([0] + qlens).astype(np.int32)
    slots = [swa_model.slot(bt[r], block, s - q + i)
             for r, (s, q) in enumerate(zip(seq, qlens)) for i in range(q)]
    return qsl, np.array(seq, np.int32), bt, np.array(slots + [-1], np.int64)


def random_steps(seed):
    """(config, arrays, causal, spans, chunk_size) of a random batch of every kind."""
    rng = random.Random(seed)
    kind = seed % 3
    if kind == 0:
        config, theta = random_config(rng)
        arrays, causal = random_batch(rng, config, theta)
        return config, arrays, causal, None, rng.randint(1, 3)
    if kind == 1:
        return CHUNKED, chunked_batch(rng), True, None, 1
    case = load_case(["mixed_mtp", "dspark_draft", "padded_decode", "vision_prefill"][seed % 4])
    b = case["batch"]
    return case["config"], batch_arrays(b), b.get("causal", True), image_spans(b), 4


def compressed_inputs(rng, md, seq, ratio):
    """Random compressed top-k of a layer of `ratio` (1: none) as the ops' keyword arguments:
    local indices a little past the request's entries and a block table with negative ids."""
    if ratio == 1:
        return {}
    td, tp = md.num_decode_tokens, md.num_prefill_tokens
    entries = max([int(s) // ratio for s in seq], default=0) + 2
    cbs = rng.choice([1, 2, 4])
    g = torch.Generator().manual_seed(rng.randint(0, 1 << 30))
    cbt = torch.randint(-1, 300, (max(len(seq), 1), entries // cbs + 1), generator=g,
                        dtype=torch.int32)
    args = {"compress_ratio": ratio, "compressed_block_table": cbt,
            "compressed_block_size": cbs,
            "prefill_local": torch.randint(-1, entries, (tp, rng.choice([4, 8, 12])),
                                           generator=g, dtype=torch.int32)}
    width = rng.choice([3, 8])
    if ratio == 128:
        args["decode_global"] = torch.randint(0, 1000, (td, width), generator=g,
                                              dtype=torch.int32)
        args["decode_global_lens"] = torch.randint(0, width + 1, (td,), generator=g,
                                                   dtype=torch.int32)
    else:
        args["decode_local"] = torch.randint(-1, entries, (td, width), generator=g,
                                             dtype=torch.int32)
    return args


def plain_mixed(md, args):
    """md.mixed_matrix with the plain function's argument names."""
    names = {"compressed_block_table": "block_table", "compressed_block_size": "block_size"}
    return md.mixed_matrix(**{names.get(k, k): v for k, v in args.items()})


def expect_combined_equal(md, ratio, chunk_size, prefill_local, rows, lens, plan):
    """The flat op result against md.combined_prefill's list of chunks."""
    chunks = md.combined_prefill(ratio, chunk_size, prefill_local=prefill_local)
    assert plan.device.type == "cpu" and plan.dtype == torch.int32
    assert plan.shape == (len(chunks), torch_ops.PLAN_COLUMNS)
    row = 0
    for (chunk, chunk_rows, chunk_lens), p in zip(chunks, plan.tolist()):
        assert tuple(p[:4]) == chunk and p[4] == row and p[5] == row + chunk_rows.shape[0]
        assert torch.equal(rows[p[4]:p[5]].cpu(), chunk_rows.cpu())
        assert torch.equal(lens[p[4]:p[5]].cpu(), chunk_lens.cpu())
        row = p[5]
    assert rows.shape[0] == md.num_prefill_tokens
    assert bool((rows[row:] == -1).all()) and bool((lens[row:] == 0).all())  # padding tokens
    return len(chunks)


@pytest.mark.parametrize("seed", range(36))
def test_ops_equal_the_plain_functions_on_random_batches(seed):
    config, arrays, causal, spans, chunk_size = random_steps(seed)
    rng = random.Random(seed)
    _, md = build(config, arrays, causal, spans)
    seq = arrays[1]
    for ratio in (1, 4, 128):
        args = compressed_inputs(rng, md, seq, ratio)
        for form in FORMS:
            got = ops.mixed_matrix(**torch_ops.metadata_args(md, "mixed_matrix"), **args,
                                   form=form)
            for g, e in zip(got, plain_mixed(md, {**args, "form": form})):
                assert g.dtype == torch.int32 and torch.equal(g, e)
        prefill_local = args.get("prefill_local")
        rows, lens, plan = ops.combined_prefill(
            **torch_ops.metadata_args(md, "combined_prefill"), compress_ratio=ratio,
            chunk_size=chunk_size, prefill_local=prefill_local)
        chunks = expect_combined_equal(md, ratio, chunk_size, prefill_local, rows, lens, plan)
        if seed % 3 == 1:
            assert chunks > 1  # the chunked-prefill batches really split
        if ratio == 1 or md.num_tokens == 0:
            continue
        local = args.get("decode_local", args.get("decode_global"))
        first = rng.randint(0, md.num_tokens - 1)
        n = min(local.shape[0], md.num_tokens - first)
        got = ops.compressed_topk_to_global(
            **torch_ops.metadata_args(md, "compressed_topk_to_global"), first_token=first,
            local=local[:n], block_table=args["compressed_block_table"],
            block_size=args["compressed_block_size"], compress_ratio=ratio)
        expected = sparse_swa.compressed_topk_to_global(
            md, first, local[:n], args["compressed_block_table"], args["compressed_block_size"],
            ratio)
        for g, e in zip(got, expected):
            assert torch.equal(g, e)


def test_a_decode_only_vision_step_keeps_the_prefill_width():
    """S = max(decode width, W + Mi) on every step of a vision config: prefill_swa_width
    carries W + Mi when the step has no prefill rows."""
    config = load_case("vision_prefill")["config"]
    bt = np.arange(8, dtype=np.int32).reshape(1, 8)
    arrays = (np.array([0, 1], np.int32), np.array([5], np.int32), bt,
              np.array([swa_model.slot(bt[0], config["block_size"], 4)], np.int64))
    _, md = build(config, arrays)
    args = torch_ops.metadata_args(md, "mixed_matrix")
    assert args["prefill_swa_indices"] is None and md.prefill_swa_width > md.decode_swa_width
    got = ops.mixed_matrix(**args)
    assert got[0].shape[1] >= md.prefill_swa_width
    for g, e in zip(got, md.mixed_matrix()):
        assert torch.equal(g, e)
    args["prefill_swa_width"] = None  # the decode rows' width alone
    assert ops.mixed_matrix(**args)[0].shape[1] == md.decode_swa_width


def replay_step(device="cpu"):
    """docs/semantics.md example 6: W = 8, replay_start [0, 8, 12], the pages below freed."""
    case = load_case("replay_prefill")
    b = case["batch"]
    _, md = build(case["config"], batch_arrays(b), device=device,
                  replay_start=np.array(b["replay_start"], np.int32))
    return md


def expect_rows(indices, want):
    for row, w in zip(indices.cpu().tolist(), want):
        assert row[:len(w)] == w and all(v == -1 for v in row[len(w):])


def test_replay_start_by_hand():
    """docs example 6: metadata_args passes md.replay_start, so the prefill rows start at each
    request's replay start in the mixed matrix and the combined prefill, as the plain functions
    give them; without it the windows reach the freed pages; past a prefix it is an error."""
    md = replay_step()
    args = torch_ops.metadata_args(md, "mixed_matrix")
    assert args["replay_start"].tolist() == [0, 8, 12]
    for form in FORMS:
        got = ops.mixed_matrix(**args, form=form)
        for g, e in zip(got, md.mixed_matrix(form=form)):
            assert torch.equal(g, e)
        expect_rows(got[0], [EX6_DECODE] + EX6_PREFILL)
        assert got[2].tolist() == [8, 1, 2, 3, 4, 5, 6, 5, 6, 7, 8]
    rows, lens, plan = ops.combined_prefill(**torch_ops.metadata_args(md, "combined_prefill"))
    assert plan.tolist() == [[0, 2, 0, 13, 0, 10]]
    expect_rows(rows, EX6_COMBINED)
    assert lens.tolist() == [1, 2, 3, 4, 5, 6, 5, 6, 7, 8]
    expect_combined_equal(md, 1, 4, None, rows, lens, plan)
    with pytest.raises(ValueError, match=r"^block_table\[1\]\[0\]: expected a block id >= 0"):
        ops.mixed_matrix(**{**args, "replay_start": None})
    past = torch.tensor([0, 9, 12], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"^replay_start\[1\]: expected 0\.\.prefix "
                                         r"seq_lens\[1\] - query_len = 14 - 6 = 8, got 9$"):
        ops.mixed_matrix(**{**args, "replay_start": past})
    with pytest.raises(ValueError, match=r"^replay_start\[1\]: expected 0\.\.prefix"):
        ops.combined_prefill(**{**torch_ops.metadata_args(md, "combined_prefill"),
                                "replay_start": past})
    with pytest.raises(ValueError, match=r"^replay_start: expected"):
        ops.mixed_matrix(**{**args, "replay_start": past.reshape(3, 1)})


def replaying_steps(seed):
    """(config, arrays, causal, replay_start) of a random batch with bounded replay."""
    rng = random.Random(seed)
    config, theta = random_config(rng)
    arrays, causal, replay = replaying_batch(rng, config, theta)
    return config, arrays, causal, replay


@pytest.mark.parametrize("seed", range(12))
def test_ops_equal_the_plain_functions_on_replaying_batches(seed):
    config, arrays, causal, replay = replaying_steps(seed)
    _, md = build(config, arrays, causal, replay_start=replay)
    rng = random.Random(seed)
    for ratio in (1, 4):
        args = compressed_inputs(rng, md, arrays[1], ratio)
        for form in FORMS:
            got = ops.mixed_matrix(**torch_ops.metadata_args(md, "mixed_matrix"), **args,
                                   form=form)
            for g, e in zip(got, plain_mixed(md, {**args, "form": form})):
                assert torch.equal(g, e)
        rows, lens, plan = ops.combined_prefill(
            **torch_ops.metadata_args(md, "combined_prefill"), compress_ratio=ratio,
            chunk_size=1, prefill_local=args.get("prefill_local"))
        expect_combined_equal(md, ratio, 1, args.get("prefill_local"), rows, lens, plan)


def dspark_step():
    """docs/semantics.md example 3: W = 8, Wn = 64; request 0 prefix 10, request 1 prefix 2,
    three draft tokens each."""
    case = load_case("dspark_draft")
    _, md = build(case["config"], batch_arrays(case["batch"]), causal=False)
    return md


def test_dspark_rows_relaid_for_sm100():
    """docs/semantics.md#sm100-relayout, worked by hand: a full window keeps its row (lens
    W + ql = 11); request 1's tokens show their causal part from column 0 and the rest of the
    block from column W = 8. The verbatim form copies the rows, lens S = 64."""
    md = dspark_step()
    req0 = [30, 31, 12, 13, 14, 15, 36, 37, 38, 39, 8]
    want = [req0] * 3 + [[20, 21, 22, -1, -1, -1, -1, -1, 23, 44],
                         [20, 21, 22, 23, -1, -1, -1, -1, 44], [20, 21, 22, 23, 44]]
    args = torch_ops.metadata_args(md, "mixed_matrix")
    assert args["causal"] is False
    for indices, lens, swa_lens in (md.mixed_matrix(), ops.mixed_matrix(**args)):
        indices, lens, swa_lens = (np.asarray(a).tolist() for a in (indices, lens, swa_lens))
        assert [row[:len(w)] for row, w in zip(indices, want)] == want
        assert all(v == -1 for row, w in zip(indices, want) for v in row[len(w):])
        assert lens == [11, 11, 11, 10, 9, 8] and swa_lens == [11, 11, 11, 5, 5, 5]
    for indices, lens, _ in (md.mixed_matrix(form="verbatim"),
                             ops.mixed_matrix(**args, form="verbatim")):
        indices = np.asarray(indices).tolist()
        assert indices[3][:6] == [20, 21, 22, 23, 44, -1] and np.asarray(lens).tolist() == [64] * 6
    with pytest.raises(ValueError, match=r'^form: expected "flashinfer_sm100" or "verbatim", '
                                         r"got 'sm90'"):
        md.mixed_matrix(form="sm90")
    with pytest.raises(ValueError, match=r"^form: expected"):
        ops.mixed_matrix(**args, form="sm90")


def one_block(width, lens=(5, 5, 5)):
    """The mixed_matrix op's arguments for one non-causal block, W = 8, identity pages, prefix
    2, ql 3 (rows 0 1 2 3 4) in a decode view `width` wide; max_decode_query_len left at 1."""
    rows = torch.full((3, width), -1, dtype=torch.int32)
    rows[:, :5] = torch.arange(5, dtype=torch.int32)
    i32 = lambda v: torch.tensor(v, dtype=torch.int32)  # noqa: E731
    return dict(query_start_loc=i32([0, 3]), seq_lens=i32([5]), block_table=i32([[0, 1]]),
                block_size=4, token_to_req_indices=i32([0, 0, 0]),
                is_valid_token=torch.ones(3, dtype=torch.bool), num_decodes=1,
                decode_swa_indices=rows, decode_swa_lens=i32(list(lens)),
                prefill_swa_indices=None, prefill_swa_lens=None, prefill_swa_width=None,
                prefill_gather_lens=None, prefill_left_visible=None, prefill_right_visible=None,
                window_size=8, causal=False)


def test_relayout_width_bound_names_the_width():
    """Token 0 needs W + spill = 10 SWA columns; a 9-wide view (vLLM-built arrays whose blocks
    outgrow Wn - W) is a ValueError, never a write past the row."""
    with pytest.raises(ValueError, match=r"^decode_swa_indices.width: the relaid non-causal row "
                                         r"of token 0 \(request 0, query_len 3, prefix 2\) needs "
                                         r"window_size \+ spill = 8 \+ 2 = 10 SWA columns, "
                                         r"expected <= the mixed matrix's S = 9, got 10"):
        ops.mixed_matrix(**one_block(9))
    indices, lens, _ = ops.mixed_matrix(**one_block(9), form="verbatim")
    assert lens.tolist() == [9, 9, 9]
    indices, lens, swa_lens = ops.mixed_matrix(**one_block(10))
    assert indices[0].tolist()[:10] == [0, 1, 2, -1, -1, -1, -1, -1, 3, 4]
    assert lens.tolist() == [10, 9, 8] and swa_lens.tolist() == [5, 5, 5]
    assert bool((lens <= indices.shape[1]).all())
    with pytest.raises(ValueError, match=r"^decode_swa_lens\[0\]: expected the non-causal "
                                         r"row's min\(prefix, window_size\) \+ query_len = "
                                         r"min\(2, 8\) \+ 3 = 5, got 3"):
        ops.mixed_matrix(**one_block(16, lens=(3, 4, 5)))


def mtp_step():
    """docs/semantics.md example 1: 3 decode tokens (W = 8), then a prefill of 4 tokens."""
    case = load_case("mixed_mtp")
    _, md = build(case["config"], batch_arrays(case["batch"]))
    return md


def error_cases(md):
    """(argument changes of mixed_matrix, message start) pairs."""
    a = torch_ops.metadata_args(md, "mixed_matrix")
    t2r, rows = a["token_to_req_indices"], a["decode_swa_indices"]
    wide = torch.zeros((rows.shape[0], rows.shape[-1] * 2), dtype=torch.int32)
    return [
        ({"token_to_req_indices": t2r.long()}, r"^token_to_req_indices: expected dtype int32"),
        ({"is_valid_token": a["is_valid_token"].int()},
         r"^is_valid_token: expected dtype bool or uint8"),
        ({"token_to_req_indices": torch.stack([t2r, t2r], 1)[:, 0]},
         r"^token_to_req_indices: expected a contiguous array"),
        ({"decode_swa_indices": wide[:, ::2]}, r"^decode_swa_indices"),  # column stride 2
        ({"decode_swa_indices": rows[:, 0].t()}, r"^decode_swa_indices"),
        ({"decode_swa_lens": a["decode_swa_lens"][:1]},
         r"^decode_swa_lens: expected 3 entries \(the rows of decode_swa_indices\)"),
        ({"decode_swa_lens": a["decode_swa_lens"] + rows.shape[-1]},
         r"^decode_swa_lens\[0\]: expected 0\.\.8 \(the row width\)"),
        ({"seq_lens": a["seq_lens"][:-1]}, r"^query_start_loc: expected the"),
        ({"block_table": a["block_table"][:1]}, r"^block_table.rows: expected >= num_reqs"),
        ({"num_decodes": 99}, r"^num_decodes: expected 0\.\.3"),
        ({"prefill_swa_lens": None}, r"^prefill_swa_indices: expected prefill_swa_indices and"),
        ({"prefill_swa_indices": None, "prefill_swa_lens": None},
         r"^prefill_swa_indices.rows: expected >= num_prefill_tokens"),
        ({"prefill_swa_width": 3}, r"^prefill_swa_width: expected the width of"),
        ({"prefill_gather_lens": None}, r"^prefill_gather_lens: expected >= 1 entries"),
        ({"window_size": 0}, r"^window_size: expected >= 1"),
        ({"replay_start": a["replay_start"].long()}, r"^replay_start: expected dtype int32"),
        ({"replay_start": a["replay_start"][:1]},
         r"^replay_start: expected >= num_reqs 3 entries \(or none: no replay\), got 1"),
        ({"block_size": 0}, r"^block_size: expected >= 1"),
        ({"causal": False}, r"^decode_swa_indices.width: non-causal"),
        ({"compress_ratio": 3}, r"compress_ratio"),
        ({"compress_ratio": 4, "compressed_block_table": torch.zeros((1, 2), dtype=torch.int32),
          "compressed_block_size": 2, "decode_local": torch.zeros((3, 2), dtype=torch.int32),
          "prefill_local": torch.zeros((4, 4), dtype=torch.int32)},
         r"^compressed_block_table.rows: expected >= num_reqs"),
    ], a


def test_mixed_matrix_errors_name_the_argument():
    md = mtp_step()
    cases, args = error_cases(md)
    for change, message in cases:
        with pytest.raises(ValueError, match=message):
            ops.mixed_matrix(**{**args, **change})


def test_combined_prefill_errors_name_the_argument():
    md = mtp_step()
    args = torch_ops.metadata_args(md, "combined_prefill")
    for change, message in [
        ({"prefill_seq_lens_cpu": None}, r"^prefill_seq_lens_cpu: expected prefill_seq_lens_cpu "
                                         r"and prefill_query_lens_cpu together"),
        ({"prefill_seq_lens_cpu": None, "prefill_query_lens_cpu": None},
         r"^prefill_seq_lens_cpu: expected 1 entries"),
        ({"prefill_query_lens_cpu": args["prefill_seq_lens_cpu"] + 1},
         r"^prefill_query_lens_cpu\[0\]: expected 0\.\.prefill_seq_lens_cpu\[0\]"),
        ({"max_model_len": -1}, r"^max_model_len: expected 0\.\."),
        ({"chunk_size": 0}, r"^chunk_size: expected >= 1"),
        ({"prefill_gather_lens": args["prefill_gather_lens"] + 100},
         r"^prefill_gather_lens\[0\]: expected 0\.\.min"),
        ({"compress_ratio": 4}, r"^prefill_local: a compress_ratio 4 layer needs"),
        ({"decode_swa_indices": torch.zeros((99, 8), dtype=torch.int32),
          "decode_swa_lens": torch.zeros(99, dtype=torch.int32)},
         r"^decode_swa_indices: expected at most 7 rows"),
    ]:
        with pytest.raises(ValueError, match=message):
            ops.combined_prefill(**{**args, **change})


def test_compressed_topk_errors_name_the_argument():
    md = mtp_step()
    args = dict(torch_ops.metadata_args(md, "compressed_topk_to_global"), first_token=0,
                local=torch.zeros((3, 4), dtype=torch.int32),
                block_table=torch.zeros((3, 2), dtype=torch.int32), block_size=2,
                compress_ratio=4)
    ops.compressed_topk_to_global(**args)
    for change, message in [
        ({"local": torch.zeros((3, 4), dtype=torch.int64)}, r"^local: expected dtype int32"),
        ({"local": torch.zeros((8, 4), dtype=torch.int32)},
         r"^local: rows for tokens \[0, 8\) must lie inside the step's 7 tokens"),
        ({"block_table": torch.zeros((1, 2), dtype=torch.int32)},
         r"^block_table.rows: expected >= num_reqs 3"),
        ({"block_size": 0}, r"^block_size: expected >= 1"),
        ({"compress_ratio": 1}, r"^compress_ratio: expected 2, 4 or 128"),
        ({"num_reqs": -1}, r"^num_reqs: expected >= 0"),
        ({"is_valid_token": args["is_valid_token"][:2]},
         r"^token_to_req_indices / is_valid_token: expected >= 7 entries"),
        ({"token_to_req_indices": torch.full((7,), 5, dtype=torch.int32)},
         r"^token_to_req_indices\[0\]: expected 0\.\.2, got 5"),
    ]:
        with pytest.raises(ValueError, match=message):
            ops.compressed_topk_to_global(**{**args, **change})


def test_schemas_and_opcheck():
    assert str(ops.combined_prefill.default._schema).endswith("-> (Tensor, Tensor, Tensor)")
    assert "int? compressed_block_size=None" in str(ops.mixed_matrix.default._schema)
    assert 'str form="flashinfer_sm100"' in str(ops.mixed_matrix.default._schema)
    for op in (ops.mixed_matrix, ops.combined_prefill):
        assert "Tensor? replay_start=None)" in str(op.default._schema)
    assert str(ops.compressed_topk_to_global.default._schema).startswith(
        "sparse_swa::compressed_topk_to_global(Tensor token_to_req_indices, Tensor "
        "is_valid_token, int num_reqs, int first_token, Tensor local, Tensor block_table, ")
    md = mtp_step()
    rng = random.Random(0)
    args = compressed_inputs(rng, md, [5, 9, 13], 4)
    torch.library.opcheck(ops.mixed_matrix.default, (),
                          {**torch_ops.metadata_args(md, "mixed_matrix"), **args})
    torch.library.opcheck(ops.compressed_topk_to_global.default, (), dict(
        torch_ops.metadata_args(md, "compressed_topk_to_global"), first_token=0,
        local=args["decode_local"], block_table=args["compressed_block_table"],
        block_size=args["compressed_block_size"], compress_ratio=4))


def consumers_step(mixed, combined, topk, compressed):
    """Calls the three consumer ops of a C4A layer and combines their outputs."""
    indices, lens, swa_lens = ops.mixed_matrix(**mixed, **compressed)
    rows, row_lens, plan = ops.combined_prefill(**combined, compress_ratio=4, chunk_size=4,
                                                prefill_local=compressed["prefill_local"])
    out, out_lens = ops.compressed_topk_to_global(
        **topk, first_token=0, local=compressed["decode_local"],
        block_table=compressed["compressed_block_table"],
        block_size=compressed["compressed_block_size"], compress_ratio=4)
    return indices + 1, lens - swa_lens, rows * 2, row_lens, plan, out, out_lens


def compiled_equals_eager(md, seq, backend):
    mixed = torch_ops.metadata_args(md, "mixed_matrix")
    # The compressed inputs live where the metadata does.
    compressed = to_device(compressed_inputs(random.Random(1), md, seq, 4),
                           mixed["query_start_loc"].device)
    inputs = (mixed, torch_ops.metadata_args(md, "combined_prefill"),
              torch_ops.metadata_args(md, "compressed_topk_to_global"), compressed)
    expected = consumers_step(*inputs)
    torch._dynamo.reset()
    got = torch.compile(consumers_step, fullgraph=True, backend=backend)(*inputs)
    for e, g in zip(expected, got):
        assert e.device == g.device and e.dtype == g.dtype and torch.equal(e, g)


def test_compile_fullgraph_cpu():
    config, arrays, causal, spans, _ = random_steps(8)
    _, md = build(config, arrays, causal, spans)
    compiled_equals_eager(md, arrays[1], "aot_eager")


@cuda
def test_compile_fullgraph_cuda():
    config, arrays, causal, spans, _ = random_steps(8)
    _, md = build(config, arrays, causal, spans, device="cuda")
    compiled_equals_eager(md, arrays[1], "inductor")


def to_device(args, device):
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in args.items()}


@cuda
@pytest.mark.parametrize("seed", range(12))
def test_cuda_ops_equal_the_cpu_ops(seed):
    config, arrays, causal, spans, chunk_size = random_steps(seed)
    _, host = build(config, arrays, causal, spans)
    _, dev = build(config, arrays, causal, spans, device="cuda")
    rng = random.Random(seed)
    for ratio in (1, 4, 128):
        args = compressed_inputs(rng, host, arrays[1], ratio)
        dev_args = to_device(args, "cuda")
        for form in FORMS:
            got = ops.mixed_matrix(**torch_ops.metadata_args(dev, "mixed_matrix"), **dev_args,
                                   form=form)
            expected = ops.mixed_matrix(**torch_ops.metadata_args(host, "mixed_matrix"), **args,
                                        form=form)
            for g, e in zip(got, expected):
                assert g.is_cuda and torch.equal(g.cpu(), e)
        pl = args.get("prefill_local")
        got = ops.combined_prefill(**torch_ops.metadata_args(dev, "combined_prefill"),
                                   compress_ratio=ratio, chunk_size=chunk_size,
                                   prefill_local=None if pl is None else pl.cuda())
        expected = ops.combined_prefill(**torch_ops.metadata_args(host, "combined_prefill"),
                                        compress_ratio=ratio, chunk_size=chunk_size,
                                        prefill_local=pl)
        assert got[0].is_cuda and got[2].device.type == "cpu"
        for g, e in zip(got, expected):
            assert torch.equal(g.cpu(), e)
        if ratio == 1 or host.num_tokens == 0:
            continue
        local = args.get("decode_local", args.get("decode_global"))
        n = min(local.shape[0], host.num_tokens)
        common = dict(first_token=0, block_size=args["compressed_block_size"],
                      compress_ratio=ratio)
        got = ops.compressed_topk_to_global(
            **torch_ops.metadata_args(dev, "compressed_topk_to_global"), local=local[:n].cuda(),
            block_table=dev_args["compressed_block_table"], **common)
        expected = ops.compressed_topk_to_global(
            **torch_ops.metadata_args(host, "compressed_topk_to_global"), local=local[:n],
            block_table=args["compressed_block_table"], **common)
        for g, e in zip(got, expected):
            assert g.is_cuda and torch.equal(g.cpu(), e)


@cuda
@pytest.mark.parametrize("seed", range(8))
def test_cuda_replaying_ops_equal_the_cpu_ops(seed):
    config, arrays, causal, replay = replaying_steps(seed)
    _, host = build(config, arrays, causal, replay_start=replay)
    _, dev = build(config, arrays, causal, device="cuda", replay_start=replay)
    assert dev.replay_start.is_cuda
    for form in FORMS:
        got = ops.mixed_matrix(**torch_ops.metadata_args(dev, "mixed_matrix"), form=form)
        expected = ops.mixed_matrix(**torch_ops.metadata_args(host, "mixed_matrix"), form=form)
        for g, e in zip(got, expected):
            assert g.is_cuda and torch.equal(g.cpu(), e)
    got = ops.combined_prefill(**torch_ops.metadata_args(dev, "combined_prefill"), chunk_size=1)
    expected = ops.combined_prefill(**torch_ops.metadata_args(host, "combined_prefill"),
                                    chunk_size=1)
    for g, e in zip(got, expected):
        assert torch.equal(g.cpu(), e)


@cuda
def test_cuda_replay_start_past_the_prefix_is_masked():
    """docs example 6 on the GPU: rows by hand; a replay start past request 1's prefix (an
    error on the CPU) gives its rows -1 and lens 0, the other requests' rows unchanged."""
    md = replay_step("cuda")
    args = torch_ops.metadata_args(md, "mixed_matrix")
    indices, lens, swa_lens = ops.mixed_matrix(**args)
    expect_rows(indices, [EX6_DECODE] + EX6_PREFILL)
    assert swa_lens.tolist() == [8, 1, 2, 3, 4, 5, 6, 5, 6, 7, 8]
    past = torch.tensor([0, 9, 12], dtype=torch.int32, device="cuda")
    indices, lens, swa_lens = ops.mixed_matrix(**{**args, "replay_start": past})
    expect_rows(indices, [EX6_DECODE] + [[]] * 6 + EX6_PREFILL[6:])
    assert lens.tolist() == [8] + [0] * 6 + [8] * 4
    combined = torch_ops.metadata_args(md, "combined_prefill")
    rows, lens, _ = ops.combined_prefill(**{**combined, "replay_start": past})
    expect_rows(rows, [[]] * 6 + EX6_COMBINED[6:])
    assert lens.tolist() == [0] * 6 + [5, 6, 7, 8]


@cuda
def test_cuda_relayout_past_the_row_is_masked():
    """The GPU cannot raise without a sync: the token whose relayout would pass its row gets -1
    and lens 0, its neighbours are re-laid as on the CPU."""
    args = to_device(one_block(9), "cuda")
    indices, lens, _ = ops.mixed_matrix(**args)
    assert lens.tolist() == [0, 9, 8]
    assert indices[0].tolist() == [-1] * indices.shape[1]
    assert indices[1].tolist()[:9] == [0, 1, 2, 3, -1, -1, -1, -1, 4]


@cuda
def test_cuda_device_mismatch_names_the_argument():
    config, arrays, causal, spans, _ = random_steps(8)
    _, dev = build(config, arrays, causal, spans, device="cuda")
    args = torch_ops.metadata_args(dev, "mixed_matrix")
    with pytest.raises(ValueError, match=r"^decode_swa_lens: expected device cuda:0 like "
                                         r"query_start_loc, got cpu"):
        ops.mixed_matrix(**{**args, "decode_swa_lens": args["decode_swa_lens"].cpu()})
    combined = torch_ops.metadata_args(dev, "combined_prefill")
    with pytest.raises(ValueError, match=r"^prefill_seq_lens_cpu: expected device cpu"):
        ops.combined_prefill(**{**combined,
                                "prefill_seq_lens_cpu": combined["prefill_seq_lens_cpu"].cuda()})
