# SPDX-License-Identifier: Apache-2.0
"""sparse_swa's operations as PyTorch custom ops, torch.ops.sparse_swa.*, so that
torch.compile(fullgraph=True) and engines that wrap kernels as custom ops can trace them.
Importing this module registers them (importing sparse_swa alone never imports torch):

    import sparse_swa.torch_ops  # noqa: F401
    out, lse = torch.ops.sparse_swa.sparse_attention(q, cache, 64, md.decode_swa_indices,
                                                     md.decode_swa_lens)

Ops (shapes as in sparse_swa's functions; T tokens, H heads, n rows):
  sparse_attention(q [T, H, 512] bf16, swa_cache, swa_block_size, indices [T, W] or [T, 1, W]
      int32, lens [T] int32, scale, sinks [H] f32, dtype, extra_cache, extra_block_size,
      extra_indices, extra_lens) -> (out [T, H, 512] bf16, lse [T, H] f32)
  sparse_attention_out(..., out, lse, workspace=None) -> ()
                                                      writes out and lse in place; workspace: a
                                                      uint8 scratch tensor on q's device sized by
                                                      sparse_swa.sparse_attention_workspace_bytes
  encode_kv(cache, block_size, rows [n, 512] f32/bf16, slots [n] int64, dtype) -> ()
                                                      writes cache in place
  decode_kv(cache, block_size, slots [n] int64, dtype) -> [n, 512] f32
  to_ragged(indices [rows, W] or [rows, 1, W], lens [rows]) -> (indptr [rows + 1] int32,
      flat [rows * W] int32: the valid prefix indptr[-1] then -1)

The index consumers take, instead of an SwaMetadata (no tensor), the metadata arrays and
scalars their consumer reads, under SwaMetadata's attribute names; metadata_args(md, op) gives
them for a metadata built over torch tensors:

    args = sparse_swa.torch_ops.metadata_args(md, "mixed_matrix")
    indices, lens, swa_lens = torch.ops.sparse_swa.mixed_matrix(**args, compress_ratio=4, ...)

  compressed_topk_to_global(token_to_req_indices [T] int32, is_valid_token [T] bool/uint8,
      num_reqs, first_token, local [n, topk] int32, block_table, block_size, compress_ratio)
      -> (out [n, topk] int32, out_lens [n] int32)      compressed_topk_to_global(md, ...)
  mixed_matrix(STEP, causal, max_decode_query_len, compress_ratio, compressed_block_table,
      compressed_block_size, decode_local, decode_global, decode_global_lens, prefill_local,
      form, replay_start) -> (indices [T, row_width], lens [T], swa_lens [T]) int32
                                                                       md.mixed_matrix(...)
  combined_prefill(STEP, prefill_seq_lens_cpu, prefill_query_lens_cpu, max_model_len,
      max_num_batched_tokens, compress_ratio, chunk_size, prefill_local, replay_start)
      -> (rows [Tp, width] int32, lens [Tp] int32, plan [chunks, 6] int32 on the CPU)
  STEP = query_start_loc, seq_lens, block_table (the SWA cache's), block_size,
      token_to_req_indices, is_valid_token, num_decodes, decode_swa_indices, decode_swa_lens,
      prefill_swa_indices, prefill_swa_lens, prefill_swa_width, prefill_gather_lens,
      prefill_left_visible, prefill_right_visible, window_size
  Td is the rows of decode_swa_indices and Tp = T - Td. prefill_swa_width (md.prefill_swa_width,
  W + max_image_tokens) keeps the mixed matrix's SWA section on steps without prefill rows.
  replay_start (md.replay_start, [>= num_reqs] int32 beside query_start_loc; None, the default,
  = no replay) is SWA bounded replay: the windows both ops recompute for prefill tokens start no
  earlier than their request's replay_start (docs/semantics.md#bounded-replay); metadata_args
  passes it.
  mixed_matrix's form "flashinfer_sm100" (default) re-lays the decode rows of a causal=False
  (DSpark) step for FlashInfer's SM100 kernel, "verbatim" copies them
  (docs/semantics.md#sm100-relayout); the shapes are the same.
  combined_prefill is md.combined_prefill(compress_ratio, chunk_size, prefill_local=...) in one
  matrix: row i is prefill token Td + i, and plan row c is chunk c's (start, end, N, M,
  row_start, row_end), its rows being rows[row_start:row_end]; rows of padding tokens (past the
  last chunk) are -1 with lens 0. The plan's length depends on host values: its fake size is
  a dynamic (unbacked) size, so torch.compile traces the op but cannot specialise on it.

Each op calls the plain sparse_swa function (CPU backend for CPU tensors, CUDA backend for CUDA
tensors, on torch's current stream); its fake implementation gives the output shapes from the
inputs' shapes. Callers who do not want the dispatcher's overhead call sparse_swa directly.
"""

from typing import Optional

import numpy as np
import torch

import sparse_swa

HEAD_SIZE = 512


def _stream(t: torch.Tensor) -> Optional[int]:
    """The cudaStream_t of torch's current stream on t's device; None for CPU tensors."""
    return torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else None


def _rows(indices: torch.Tensor) -> torch.Tensor:
    """[T, 1, W] (the builder's rows) -> the [T, W] view; [T, W] as it is."""
    return indices[:, 0] if indices.dim() == 3 else indices


def _bf16_bits(t: torch.Tensor) -> np.ndarray:
    """A CPU bf16 tensor as a numpy uint16 array of its bit patterns (no copy when contiguous)."""
    return t.contiguous().view(torch.int16).numpy().view(np.uint16)


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise ValueError(message)


def _check_attention(q: torch.Tensor, indices: torch.Tensor, lens: torch.Tensor) -> None:
    _check(q.dim() == 3 and q.shape[-1] == HEAD_SIZE,
           f"q: expected shape [T, H, {HEAD_SIZE}], got {list(q.shape)}")
    _check(q.dtype == torch.bfloat16, f"q: expected dtype torch.bfloat16, got {q.dtype}")
    _check(indices.dim() in (2, 3), f"indices: expected [T, W] or [T, 1, W], got "
           f"{list(indices.shape)}")
    _check(lens.dim() == 1, f"lens: expected shape [T], got {list(lens.shape)}")


def _attention(q, swa_cache, swa_block_size, indices, lens, scale, sinks, dtype, extra_cache,
               extra_block_size, extra_indices, extra_lens, out, lse, workspace=None) -> None:
    """Runs the attention into out [T, H, 512] bf16 and lse [T, H] f32 (same device as q); the
    CUDA kernels may use `workspace` (uint8) as scratch, the CPU backend needs none."""
    _check_attention(q, indices, lens)
    extra = {}
    if extra_cache is not None:
        extra = {"extra_cache": extra_cache, "extra_block_size": extra_block_size,
                 "extra_indices": _rows(extra_indices), "extra_lens": extra_lens}
    if q.is_cuda:
        sparse_swa.sparse_attention(q, swa_cache, swa_block_size, _rows(indices), lens, scale,
                                    sinks, dtype, out=out, lse=lse, stream=_stream(q),
                                    workspace=workspace, **extra)
        return
    # The CPU backend takes and returns bf16 as uint16 bit patterns in numpy arrays.
    if extra:
        extra = {k: (v.numpy() if isinstance(v, torch.Tensor) else v) for k, v in extra.items()}
    host_out, host_lse = sparse_swa.sparse_attention(
        _bf16_bits(q), swa_cache.numpy(), swa_block_size, _rows(indices).numpy(), lens.numpy(),
        scale, None if sinks is None else sinks.numpy(), dtype, **extra)
    out.copy_(torch.from_numpy(np.asarray(host_out).view(np.int16)).view(torch.bfloat16))
    lse.copy_(torch.from_numpy(np.asarray(host_lse)))


@torch.library.custom_op(
    "sparse_swa::sparse_attention", mutates_args=(),
    schema="(Tensor q, Tensor swa_cache, int swa_block_size, Tensor indices, Tensor lens, "
    "float? scale=None, Tensor? sinks=None, str dtype=\"fp8_ds_mla\", Tensor? extra_cache=None, "
    "int? extra_block_size=None, Tensor? extra_indices=None, Tensor? extra_lens=None) "
    "-> (Tensor, Tensor)")
def sparse_attention(q, swa_cache, swa_block_size, indices, lens, scale=None, sinks=None,
                     dtype="fp8_ds_mla", extra_cache=None, extra_block_size=None,
                     extra_indices=None, extra_lens=None):
    out = torch.empty(q.shape, dtype=torch.bfloat16, device=q.device)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
    _attention(q, swa_cache, swa_block_size, indices, lens, scale, sinks, dtype, extra_cache,
               extra_block_size, extra_indices, extra_lens, out, lse)
    return out, lse


@sparse_attention.register_fake
def _(q, swa_cache, swa_block_size, indices, lens, scale=None, sinks=None, dtype="fp8_ds_mla",
      extra_cache=None, extra_block_size=None, extra_indices=None, extra_lens=None):
    _check_attention(q, indices, lens)
    return (q.new_empty(q.shape, dtype=torch.bfloat16),
            q.new_empty(q.shape[:2], dtype=torch.float32))


# Defined with torch.library.define, not custom_op: custom_op's version-counter step (torch 2.11)
# looks for each mutated argument among those the dispatcher passes, which leave out a `workspace`
# at its default, so a call without one raised IndexError.
torch.library.define(
    "sparse_swa::sparse_attention_out",
    "(Tensor q, Tensor swa_cache, int swa_block_size, Tensor indices, Tensor lens, "
    "Tensor(a!) out, Tensor(b!) lse, float? scale=None, Tensor? sinks=None, "
    "str dtype=\"fp8_ds_mla\", Tensor? extra_cache=None, int? extra_block_size=None, "
    "Tensor? extra_indices=None, Tensor? extra_lens=None, Tensor(c!)? workspace=None) -> ()")


@torch.library.impl("sparse_swa::sparse_attention_out", ("cpu", "cuda"))
def _(q, swa_cache, swa_block_size, indices, lens, out, lse, scale=None, sinks=None,
      dtype="fp8_ds_mla", extra_cache=None, extra_block_size=None, extra_indices=None,
      extra_lens=None, workspace=None):
    _attention(q, swa_cache, swa_block_size, indices, lens, scale, sinks, dtype, extra_cache,
               extra_block_size, extra_indices, extra_lens, out, lse, workspace)


@torch.library.register_fake("sparse_swa::sparse_attention_out")
def _(q, swa_cache, swa_block_size, indices, lens, out, lse, scale=None, sinks=None,
      dtype="fp8_ds_mla", extra_cache=None, extra_block_size=None, extra_indices=None,
      extra_lens=None, workspace=None):
    _check_attention(q, indices, lens)
    _check(tuple(out.shape) == tuple(q.shape), f"out: expected shape {list(q.shape)}, got "
           f"{list(out.shape)}")
    _check(tuple(lse.shape) == tuple(q.shape[:2]), f"lse: expected shape {list(q.shape[:2])}, "
           f"got {list(lse.shape)}")


sparse_attention_out = torch.ops.sparse_swa.sparse_attention_out


@torch.library.custom_op(
    "sparse_swa::encode_kv", mutates_args=("cache",),
    schema="(Tensor(a!) cache, int block_size, Tensor rows, Tensor slots, "
    "str dtype=\"fp8_ds_mla\") -> ()")
def encode_kv(cache, block_size, rows, slots, dtype="fp8_ds_mla"):
    if cache.is_cuda:
        sparse_swa.encode_kv(cache, block_size, rows, slots, dtype, stream=_stream(cache))
    else:  # the CPU backend takes float32 rows; cache.numpy() shares the tensor's memory
        sparse_swa.encode_kv(cache.numpy(), block_size, rows.float().contiguous().numpy(),
                             slots.numpy(), dtype)


@encode_kv.register_fake
def _(cache, block_size, rows, slots, dtype="fp8_ds_mla"):
    _check(rows.dim() == 2 and rows.shape[-1] == HEAD_SIZE,
           f"rows: expected shape [n, {HEAD_SIZE}], got {list(rows.shape)}")


@torch.library.custom_op(
    "sparse_swa::decode_kv", mutates_args=(),
    schema="(Tensor cache, int block_size, Tensor slots, str dtype=\"fp8_ds_mla\") -> Tensor")
def decode_kv(cache, block_size, slots, dtype="fp8_ds_mla"):
    if cache.is_cuda:
        out = torch.empty((slots.shape[0], HEAD_SIZE), dtype=torch.float32, device=cache.device)
        sparse_swa.decode_kv(cache, block_size, slots, dtype, out=out, stream=_stream(cache))
        return out
    return torch.from_numpy(
        np.asarray(sparse_swa.decode_kv(cache.numpy(), block_size, slots.numpy(), dtype)))


@decode_kv.register_fake
def _(cache, block_size, slots, dtype="fp8_ds_mla"):
    _check(slots.dim() == 1, f"slots: expected shape [n], got {list(slots.shape)}")
    return cache.new_empty((slots.shape[0], HEAD_SIZE), dtype=torch.float32)


@torch.library.custom_op("sparse_swa::to_ragged", mutates_args=(),
                         schema="(Tensor indices, Tensor lens) -> (Tensor, Tensor)")
def to_ragged(indices, lens):
    rows = _rows(indices)
    capacity = rows.shape[0] * rows.shape[1]
    if indices.is_cuda:
        indptr, flat = sparse_swa.to_ragged(rows, lens, stream=_stream(indices))
        # The device flat holds the prefix only; -1 past it, without reading indptr on the host.
        pos = torch.arange(capacity, dtype=torch.int32, device=flat.device)
        return indptr, flat.masked_fill_(pos >= indptr[-1], -1)
    indptr, flat = sparse_swa.to_ragged(rows.numpy(), lens.numpy())
    full = torch.full((capacity,), -1, dtype=torch.int32)
    flat = torch.from_numpy(np.asarray(flat))
    full[: flat.shape[0]] = flat
    return torch.from_numpy(np.asarray(indptr)), full


@to_ragged.register_fake
def _(indices, lens):
    _check(indices.dim() in (2, 3), f"indices: expected [rows, W] or [rows, 1, W], got "
           f"{list(indices.shape)}")
    rows = _rows(indices)
    return (indices.new_empty((rows.shape[0] + 1,), dtype=torch.int32),
            indices.new_empty((rows.shape[0] * rows.shape[1],), dtype=torch.int32))


# The index consumers. SwaMetadata is no tensor, so these ops take the metadata arrays and
# scalars their consumer reads, under SwaMetadata's attribute names; metadata_args(md, op) gives
# them from a metadata built over torch tensors.

_STEP_SCHEMA = (
    "Tensor query_start_loc, Tensor seq_lens, Tensor block_table, int block_size, "
    "Tensor token_to_req_indices, Tensor is_valid_token, int num_decodes, "
    "Tensor decode_swa_indices, Tensor decode_swa_lens, Tensor? prefill_swa_indices, "
    "Tensor? prefill_swa_lens, int? prefill_swa_width, Tensor? prefill_gather_lens, "
    "Tensor? prefill_left_visible, Tensor? prefill_right_visible, int window_size")
_STEP_ARGS = ("query_start_loc", "seq_lens", "block_table", "block_size", "token_to_req_indices",
              "is_valid_token", "num_decodes", "decode_swa_indices", "decode_swa_lens",
              "prefill_swa_indices", "prefill_swa_lens", "prefill_swa_width",
              "prefill_gather_lens", "prefill_left_visible", "prefill_right_visible",
              "window_size")


def metadata_args(md, op: str) -> dict:
    """The metadata keyword arguments of consumer op `op` ("compressed_topk_to_global",
    "mixed_matrix" or "combined_prefill") from an SwaMetadata built over torch tensors."""
    if op == "compressed_topk_to_global":
        return {"token_to_req_indices": md.token_to_req_indices,
                "is_valid_token": md.is_valid_token, "num_reqs": md.num_reqs}
    _check(op in ("mixed_matrix", "combined_prefill"),
           f"op: expected compressed_topk_to_global, mixed_matrix or combined_prefill, got {op!r}")
    args = {name: getattr(md, name) for name in _STEP_ARGS}
    args["replay_start"] = md.replay_start
    if op == "mixed_matrix":
        args.update(causal=md.causal, max_decode_query_len=md.max_decode_query_len)
    else:
        args.update(prefill_seq_lens_cpu=md.prefill_seq_lens_cpu,
                    prefill_query_lens_cpu=md.prefill_query_lens_cpu,
                    max_model_len=md.prefill_max_model_len,
                    max_num_batched_tokens=md.prefill_max_num_batched_tokens)
    return args


def _round_up(x, m):
    return (x + m - 1) // m * m


def _check_index_rank(t: Optional[torch.Tensor], name: str) -> None:
    _check(t is None or t.dim() in (2, 3), f"{name}: expected [rows, W] or [rows, 1, W], got "
           f"{None if t is None else list(t.shape)}")


def _prefill_width(prefill_swa_indices, prefill_swa_width):
    """The prefill rows' width: the array's, else the given width (0 without either)."""
    if prefill_swa_indices is not None:
        return prefill_swa_indices.shape[-1]
    return 0 if prefill_swa_width is None else prefill_swa_width


def _check_replay_start(replay_start: Optional[torch.Tensor]) -> None:
    """replay_start (optional) is [>= num_reqs]; the plain function checks its length and values."""
    if replay_start is not None:
        _check(replay_start.dim() == 1,
               f"replay_start: expected shape [num_reqs], got {list(replay_start.shape)}")


def _prefill_tokens(token_to_req_indices, decode_swa_indices):
    """Tp = T - Td: the tokens of token_to_req_indices past the decode rows."""
    _check(token_to_req_indices.dim() == 1, "token_to_req_indices: expected shape [T], got "
           f"{list(token_to_req_indices.shape)}")
    _check_index_rank(decode_swa_indices, "decode_swa_indices")
    tp = token_to_req_indices.shape[0] - decode_swa_indices.shape[0]
    _check(tp >= 0, f"decode_swa_indices: expected at most {token_to_req_indices.shape[0]} rows "
           f"(the entries of token_to_req_indices), got {decode_swa_indices.shape[0]}")
    return tp


@torch.library.custom_op(
    "sparse_swa::compressed_topk_to_global", mutates_args=(),
    schema="(Tensor token_to_req_indices, Tensor is_valid_token, int num_reqs, int first_token, "
    "Tensor local, Tensor block_table, int block_size, int compress_ratio) -> (Tensor, Tensor)")
def compressed_topk_to_global(token_to_req_indices, is_valid_token, num_reqs, first_token, local,
                              block_table, block_size, compress_ratio):
    return sparse_swa._sparse_swa._compressed_topk_to_global_arrays(
        token_to_req_indices, is_valid_token, num_reqs, first_token, local, block_table,
        block_size, compress_ratio, stream=_stream(token_to_req_indices))


@compressed_topk_to_global.register_fake
def _(token_to_req_indices, is_valid_token, num_reqs, first_token, local, block_table,
      block_size, compress_ratio):
    _check_index_rank(local, "local")
    rows = _rows(local)
    return (local.new_empty((rows.shape[0], rows.shape[1]), dtype=torch.int32),
            local.new_empty((rows.shape[0],), dtype=torch.int32))


@torch.library.custom_op(
    "sparse_swa::mixed_matrix", mutates_args=(),
    schema="(" + _STEP_SCHEMA + ", bool causal=True, int max_decode_query_len=1, "
    "int compress_ratio=1, Tensor? compressed_block_table=None, "
    "int? compressed_block_size=None, Tensor? decode_local=None, Tensor? decode_global=None, "
    "Tensor? decode_global_lens=None, Tensor? prefill_local=None, "
    "str form=\"flashinfer_sm100\", Tensor? replay_start=None) -> (Tensor, Tensor, Tensor)")
def mixed_matrix(query_start_loc, seq_lens, block_table, block_size, token_to_req_indices,
                 is_valid_token, num_decodes, decode_swa_indices, decode_swa_lens,
                 prefill_swa_indices, prefill_swa_lens, prefill_swa_width, prefill_gather_lens,
                 prefill_left_visible, prefill_right_visible, window_size, causal=True,
                 max_decode_query_len=1, compress_ratio=1, compressed_block_table=None,
                 compressed_block_size=None, decode_local=None, decode_global=None,
                 decode_global_lens=None, prefill_local=None, form="flashinfer_sm100",
                 replay_start=None):
    return sparse_swa._sparse_swa._mixed_matrix_arrays(
        query_start_loc, seq_lens, block_table, block_size, token_to_req_indices,
        is_valid_token, num_decodes, decode_swa_indices, decode_swa_lens, prefill_swa_indices,
        prefill_swa_lens, prefill_swa_width, prefill_gather_lens, prefill_left_visible,
        prefill_right_visible, window_size, causal=causal,
        max_decode_query_len=max_decode_query_len, compress_ratio=compress_ratio,
        compressed_block_table=compressed_block_table,
        compressed_block_size=compressed_block_size, decode_local=decode_local,
        decode_global=decode_global, decode_global_lens=decode_global_lens,
        prefill_local=prefill_local, form=form, replay_start=replay_start,
        stream=_stream(query_start_loc))


@mixed_matrix.register_fake
def _(query_start_loc, seq_lens, block_table, block_size, token_to_req_indices, is_valid_token,
      num_decodes, decode_swa_indices, decode_swa_lens, prefill_swa_indices, prefill_swa_lens,
      prefill_swa_width, prefill_gather_lens, prefill_left_visible, prefill_right_visible,
      window_size, causal=True, max_decode_query_len=1, compress_ratio=1,
      compressed_block_table=None, compressed_block_size=None, decode_local=None,
      decode_global=None, decode_global_lens=None, prefill_local=None, form="flashinfer_sm100",
      replay_start=None):
    _check_replay_start(replay_start)
    _check(form in ("flashinfer_sm100", "verbatim"),
           f'form: expected "flashinfer_sm100" or "verbatim", got {form!r}')
    # consumers.h mixed_matrix_shape: S = max(decode width, prefill width),
    # P = round_up(max(TOP_K, decode compressed width), 4), row = round_up(S + P, 4).
    for t, name in ((prefill_swa_indices, "prefill_swa_indices"), (decode_local, "decode_local"),
                    (decode_global, "decode_global"), (prefill_local, "prefill_local")):
        _check_index_rank(t, name)
    _prefill_tokens(token_to_req_indices, decode_swa_indices)
    s = torch.sym_max(decode_swa_indices.shape[-1],
                      _prefill_width(prefill_swa_indices, prefill_swa_width))
    decode_topk = 0
    if decode_local is not None:
        decode_topk = decode_local.shape[-1]
    if decode_global is not None and decode_global.shape[-1] > 0:
        decode_topk = decode_global.shape[-1]
    prefill_topk = 0 if prefill_local is None else prefill_local.shape[-1]
    row_width = _round_up(s + _round_up(torch.sym_max(prefill_topk, decode_topk), 4), 4)
    t = token_to_req_indices.shape[0]
    new = query_start_loc.new_empty
    return (new((t, row_width), dtype=torch.int32), new((t,), dtype=torch.int32),
            new((t,), dtype=torch.int32))


PLAN_COLUMNS = 6  # start, end, N, M, row_start, row_end


def _combined_prefill_shape(token_to_req_indices, decode_swa_indices, prefill_swa_indices,
                            prefill_swa_width, prefill_local):
    """(Tp, width): consumers.h combined_prefill_shape's width round_up(TOP_K + W + Mi, 128)."""
    _check_index_rank(prefill_swa_indices, "prefill_swa_indices")
    _check_index_rank(prefill_local, "prefill_local")
    topk = 0 if prefill_local is None else prefill_local.shape[-1]
    width = _round_up(topk + _prefill_width(prefill_swa_indices, prefill_swa_width), 128)
    return _prefill_tokens(token_to_req_indices, decode_swa_indices), width


@torch.library.custom_op(
    "sparse_swa::combined_prefill", mutates_args=(),
    schema="(" + _STEP_SCHEMA + ", Tensor? prefill_seq_lens_cpu, Tensor? prefill_query_lens_cpu, "
    "int max_model_len, int max_num_batched_tokens, int compress_ratio=1, int chunk_size=4, "
    "Tensor? prefill_local=None, Tensor? replay_start=None) -> (Tensor, Tensor, Tensor)")
def combined_prefill(query_start_loc, seq_lens, block_table, block_size, token_to_req_indices,
                     is_valid_token, num_decodes, decode_swa_indices, decode_swa_lens,
                     prefill_swa_indices, prefill_swa_lens, prefill_swa_width,
                     prefill_gather_lens, prefill_left_visible, prefill_right_visible,
                     window_size, prefill_seq_lens_cpu, prefill_query_lens_cpu, max_model_len,
                     max_num_batched_tokens, compress_ratio=1, chunk_size=4, prefill_local=None,
                     replay_start=None):
    tp, width = _combined_prefill_shape(token_to_req_indices, decode_swa_indices,
                                        prefill_swa_indices, prefill_swa_width, prefill_local)
    device = query_start_loc.device
    rows = torch.full((tp, width), -1, dtype=torch.int32, device=device)
    lens = torch.zeros((tp,), dtype=torch.int32, device=device)
    plan = sparse_swa._sparse_swa._combined_prefill_arrays(
        query_start_loc, seq_lens, block_table, block_size, token_to_req_indices,
        is_valid_token, num_decodes, decode_swa_indices, decode_swa_lens, prefill_swa_indices,
        prefill_swa_lens, prefill_swa_width, prefill_gather_lens, prefill_left_visible,
        prefill_right_visible, window_size, prefill_seq_lens_cpu, prefill_query_lens_cpu,
        max_model_len, max_num_batched_tokens, compress_ratio=compress_ratio,
        chunk_size=chunk_size, prefill_local=prefill_local, out=rows, out_lens=lens,
        replay_start=replay_start, stream=_stream(query_start_loc))
    plan = torch.tensor(plan, dtype=torch.int32).reshape(len(plan), PLAN_COLUMNS)
    return rows, lens, plan


@combined_prefill.register_fake
def _(query_start_loc, seq_lens, block_table, block_size, token_to_req_indices, is_valid_token,
      num_decodes, decode_swa_indices, decode_swa_lens, prefill_swa_indices, prefill_swa_lens,
      prefill_swa_width, prefill_gather_lens, prefill_left_visible, prefill_right_visible,
      window_size, prefill_seq_lens_cpu, prefill_query_lens_cpu, max_model_len,
      max_num_batched_tokens, compress_ratio=1, chunk_size=4, prefill_local=None,
      replay_start=None):
    _check_replay_start(replay_start)
    tp, width = _combined_prefill_shape(token_to_req_indices, decode_swa_indices,
                                        prefill_swa_indices, prefill_swa_width, prefill_local)
    chunks = torch.library.get_ctx().new_dynamic_size()  # the plan depends on host lens
    new = query_start_loc.new_empty
    return (new((tp, width), dtype=torch.int32), new((tp,), dtype=torch.int32),
            torch.empty((chunks, PLAN_COLUMNS), dtype=torch.int32, device="cpu"))
