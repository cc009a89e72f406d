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
  sparse_attention_out(..., out, lse) -> ()           writes out and lse in place
  encode_kv(cache, block_size, rows [n, 512] f32/bf16, slots [n] int64, dtype) -> ()
                                                      writes cache in place
  decode_kv(cache, block_size, slots [n] int64, dtype) -> [n, 512] f32
  to_ragged(indices [rows, W] or [rows, 1, W], lens [rows]) -> (indptr [rows + 1] int32,
      flat [rows * W] int32: the valid prefix indptr[-1] then -1)

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
               extra_block_size, extra_indices, extra_lens, out, lse) -> None:
    """Runs the attention into out [T, H, 512] bf16 and lse [T, H] f32 (same device as q)."""
    _check_attention(q, indices, lens)
    extra = {}
    if extra_cache is not None:
        extra = {"extra_cache": extra_cache, "extra_block_size": extra_block_size,
                 "extra_indices": _rows(extra_indices), "extra_lens": extra_lens}
    if q.is_cuda:
        sparse_swa.sparse_attention(q, swa_cache, swa_block_size, _rows(indices), lens, scale,
                                    sinks, dtype, out=out, lse=lse, stream=_stream(q), **extra)
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


@torch.library.custom_op(
    "sparse_swa::sparse_attention_out", mutates_args=("out", "lse"),
    schema="(Tensor q, Tensor swa_cache, int swa_block_size, Tensor indices, Tensor lens, "
    "Tensor(a!) out, Tensor(b!) lse, float? scale=None, Tensor? sinks=None, "
    "str dtype=\"fp8_ds_mla\", Tensor? extra_cache=None, int? extra_block_size=None, "
    "Tensor? extra_indices=None, Tensor? extra_lens=None) -> ()")
def sparse_attention_out(q, swa_cache, swa_block_size, indices, lens, out, lse, scale=None,
                         sinks=None, dtype="fp8_ds_mla", extra_cache=None,
                         extra_block_size=None, extra_indices=None, extra_lens=None):
    _attention(q, swa_cache, swa_block_size, indices, lens, scale, sinks, dtype, extra_cache,
               extra_block_size, extra_indices, extra_lens, out, lse)


@sparse_attention_out.register_fake
def _(q, swa_cache, swa_block_size, indices, lens, out, lse, scale=None, sinks=None,
      dtype="fp8_ds_mla", extra_cache=None, extra_block_size=None, extra_indices=None,
      extra_lens=None):
    _check_attention(q, indices, lens)
    _check(tuple(out.shape) == tuple(q.shape), f"out: expected shape {list(q.shape)}, got "
           f"{list(out.shape)}")
    _check(tuple(lse.shape) == tuple(q.shape[:2]), f"lse: expected shape {list(q.shape[:2])}, "
           f"got {list(lse.shape)}")


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
