// SPDX-License-Identifier: Apache-2.0
#include "attention_binding.h"

#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <climits>
#include <span>
#include <string>
#include <tuple>

#include "array_input.h"
#include "consumers_binding.h"
#include "python_values.h"
#include "sparse_swa/attention.h"
#include "sparse_swa/kv_cache.h"
#include "status_exceptions.h"

namespace sparse_swa::python {

namespace {

const char* dtype_label(const nb::dlpack::dtype& d) {
  if (d == nb::dtype<uint8_t>()) return "uint8";
  if (d == nb::dtype<uint16_t>()) return "uint16";
  if (d == nb::dtype<int32_t>()) return "int32";
  if (d == nb::dtype<int64_t>()) return "int64";
  if (d == nb::dtype<float>()) return "float32";
  return "another dtype";
}

// Host T array of `ndim` dimensions seen as [shape(0), product of the rest] with C-contiguous
// rows. Device arrays: NotImplementedError (this binding runs the CPU backend only).
template <typename T, typename Array>
MatrixView<T> host_matrix(const Array& a, std::string_view field, const char* want, size_t ndim) {
  if (a.device_type() != nb::device::cpu::value) {
    raise_status(unimplemented(field, ": host (cpu) arrays only for now"));
  }
  if (a.dtype() != nb::dtype<std::remove_const_t<T>>()) {
    raise_value_error(str_cat(field, ": expected dtype ", want, ", got ", dtype_label(a.dtype())));
  }
  if (a.ndim() != ndim) {
    raise_value_error(str_cat(field, ": expected ", ndim, " dimensions, got ", a.ndim()));
  }
  expect_countable(a, field);        // before any product of the dimensions
  const bool empty = a.size() == 0;  // any strides; nothing is read
  int64_t cols = 1;
  for (size_t d = ndim; d-- > 1;) {
    if (!empty && a.shape(d) > 1 && a.stride(d) != cols) {
      raise_value_error(str_cat(field, ": expected C-contiguous rows, got stride ", a.stride(d),
                                " in dimension ", d));
    }
    cols *= static_cast<int64_t>(a.shape(d));
  }
  const auto rows = static_cast<int64_t>(ndim == 0 ? 1 : a.shape(0));
  const int64_t stride = rows > 1 && !empty ? a.stride(0) : cols;
  if (stride < cols) {
    raise_value_error(str_cat(field, ": expected a row stride >= ", cols, ", got ", stride));
  }
  if (!empty) expect_aligned(a.data(), alignof(T), field);
  return {static_cast<T*>(const_cast<void*>(static_cast<const void*>(a.data()))), rows, cols,
          stride, MemorySpace::kHost};
}

template <typename T>
MatrixView<const T> input_matrix(nb::handle obj, std::string_view field, const char* want,
                                 size_t ndim) {
  nb::ndarray<nb::ro> a;
  if (!nb::try_cast(obj, a, /*convert=*/false)) {
    const char* article = want[0] == 'i' ? "an " : "a ";  // int32, int64; float32
    raise_value_error(
        str_cat(field, ": expected ", article, want, " array, got ", type_name_of(obj)));
  }
  return host_matrix<const T>(a, field, want, ndim);
}

// 1-D inputs are [1, n] matrices of one contiguous row.
template <typename T>
std::span<const T> input_vector(nb::handle obj, std::string_view field, const char* want) {
  const MatrixView<const T> m = input_matrix<T>(obj, field, want, 1);
  if (m.rows > 1 && m.stride != 1) {
    raise_value_error(
        str_cat(field, ": expected a contiguous array (stride 1), got stride ", m.stride));
  }
  return {m.data, static_cast<size_t>(m.rows)};
}

CacheDtype dtype_from(nb::handle name) {
  auto d = parse_cache_dtype(string_from_python(name, "dtype"));
  throw_if_error(d.status());
  return d.value();
}

CacheConsumer consumer_from(nb::handle value) {
  const std::string name = string_from_python(value, "consumer");
  if (name == "flashmla") return CacheConsumer::kFlashMla;
  if (name == "flashinfer") return CacheConsumer::kFlashInfer;
  raise_value_error(
      str_cat("consumer: expected \"flashmla\" or \"flashinfer\", got ", value_text(value)));
}

nb::dict layout_dict(const StatusOr<PageLayout>& layout) {
  throw_if_error(layout.status());
  const PageLayout& l = layout.value();
  nb::dict d;
  d["block_size"] = l.block_size;
  d["compress_ratio"] = l.compress_ratio;
  d["dtype"] = cache_dtype_name(l.dtype);
  d["consumer"] = cache_consumer_name(l.consumer);
  d["head_size"] = l.head_size;
  d["token_bytes"] = l.token_bytes;
  d["content_bytes"] = l.content_bytes;
  d["alignment"] = l.alignment;
  d["page_bytes"] = l.page_bytes;
  return d;
}

nb::dict page_layout_dict(nb::handle block_size, nb::handle dtype, nb::handle consumer) {
  return layout_dict(page_layout(int32_from_python(block_size, "block_size"), dtype_from(dtype),
                                 consumer_from(consumer)));
}

nb::dict compressed_page_layout_dict(nb::handle attn_block_size, nb::handle compress_ratio,
                                     nb::handle dtype, nb::handle consumer) {
  return layout_dict(compressed_page_layout(int32_from_python(attn_block_size, "attn_block_size"),
                                            int32_from_python(compress_ratio, "compress_ratio"),
                                            dtype_from(dtype), consumer_from(consumer)));
}

// A [num_blocks, >= content bytes] uint8 host cache: the row stride is the page stride, and the
// columns must hold a page's content (the library reads and writes all of it on every page).
template <typename Void, typename Array>
BasicKvCacheView<Void> cache_view(const Array& a, std::string_view field, int32_t block_size,
                                  nb::handle dtype) {
  using Byte = std::conditional_t<std::is_const_v<Void>, const uint8_t, uint8_t>;
  const MatrixView<Byte> m = host_matrix<Byte>(a, field, "uint8", 2);
  const CacheDtype d = dtype_from(dtype);
  const int64_t content = int64_t{block_size} * cache_token_bytes(d);
  if (block_size >= 1 && m.cols < content) {
    raise_value_error(str_cat(field, ": expected >= ", content, " columns (block_size ", block_size,
                              " * ", cache_token_bytes(d), " bytes of ", cache_dtype_name(d),
                              ", a page's content), got ", m.cols));
  }
  const int64_t stride = a.shape(0) > 1 ? m.stride : m.cols;
  return {m.data, m.rows, block_size, stride, d, MemorySpace::kHost};
}

ConstKvCacheView input_cache(nb::handle obj, std::string_view field, int32_t block_size,
                             nb::handle dtype) {
  nb::ndarray<nb::ro> a;
  if (!nb::try_cast(obj, a, /*convert=*/false)) {
    raise_value_error(str_cat(field, ": expected a uint8 array, got ", type_name_of(obj)));
  }
  return cache_view<const void>(a, field, block_size, dtype);
}

void encode_kv(nb::handle cache_obj, nb::handle block_size_obj, nb::handle rows_obj,
               nb::handle slots_obj, nb::handle dtype) {
  const int32_t block_size = int32_from_python(block_size_obj, "block_size");
  nb::ndarray<> cache_array;
  if (!nb::try_cast(cache_obj, cache_array, /*convert=*/false)) {
    raise_value_error(
        str_cat("cache: expected a writable uint8 array, got ", type_name_of(cache_obj)));
  }
  const KvCacheView cache = cache_view<void>(cache_array, "cache", block_size, dtype);
  const MatrixView<const float> rows = input_matrix<float>(rows_obj, "rows", "float32", 2);
  const std::span<const int64_t> slots = input_vector<int64_t>(slots_obj, "slots", "int64");
  throw_if_error(encode_kv_rows(rows, slots, cache));
}

nb::object decode_kv(nb::handle cache_obj, nb::handle block_size_obj, nb::handle slots_obj,
                     nb::handle dtype) {
  const int32_t block_size = int32_from_python(block_size_obj, "block_size");
  const ConstKvCacheView cache = input_cache(cache_obj, "cache", block_size, dtype);
  const std::span<const int64_t> slots = input_vector<int64_t>(slots_obj, "slots", "int64");
  auto [out, data] =
      new_host_array<float>("slots", {slots.size(), static_cast<size_t>(kHeadDim)}, 0.0f);
  const MatrixView<float> view{data, static_cast<int64_t>(slots.size()), kHeadDim, kHeadDim,
                               MemorySpace::kHost};
  throw_if_error(decode_kv_rows(cache, slots, view));
  return out;
}

std::tuple<nb::object, nb::object> attention(nb::handle q_obj, nb::handle cache_obj,
                                             nb::handle block_size_obj, nb::handle indices_obj,
                                             nb::handle lens_obj, nb::handle scale_obj,
                                             nb::handle sinks_obj, nb::handle dtype) {
  const int32_t block_size = int32_from_python(block_size_obj, "swa_block_size");
  const float scale =
      scale_obj.is_none() ? kDefaultSoftmaxScale : float_from_python(scale_obj, "scale");
  nb::ndarray<nb::ro> q_array;
  if (!nb::try_cast(q_obj, q_array, /*convert=*/false)) {
    raise_value_error(str_cat("q: expected a uint16 (bf16 bits) array, got ", type_name_of(q_obj)));
  }
  const MatrixView<const uint16_t> q = host_matrix<const uint16_t>(q_array, "q", "uint16", 3);
  const size_t tokens = q_array.shape(0);
  const size_t heads = q_array.shape(1);
  const size_t dim = q_array.shape(2);
  if (tokens > 1 && q.stride != q.cols) {
    raise_value_error(str_cat("q: expected a contiguous array, got row stride ", q.stride));
  }
  // Shapes before the outputs are allocated (they are as large as q).
  if (heads < 1 || heads > static_cast<size_t>(kMaxAttentionHeads)) {
    raise_value_error(str_cat("q: expected 1..", kMaxAttentionHeads, " heads (dimension 1), got ",
                              heads, " (shape [", tokens, ", ", heads, ", ", dim, "])"));
  }
  if (dim != static_cast<size_t>(kHeadDim)) {
    raise_value_error(str_cat("q: expected head dim ", kHeadDim, ", got ", dim));
  }
  const MatrixView<const int32_t> idx = input_matrix<int32_t>(indices_obj, "indices", "int32", 2);
  if (idx.cols > INT32_MAX) {
    raise_value_error(
        str_cat("indices: expected a width (columns) <= ", INT32_MAX, ", got ", idx.cols));
  }
  if (idx.rows != static_cast<int64_t>(tokens)) {
    raise_value_error(
        str_cat("indices: expected ", tokens, " rows (the tokens of q), got ", idx.rows));
  }
  const std::span<const int32_t> lens = input_vector<int32_t>(lens_obj, "lens", "int32");
  if (static_cast<int64_t>(lens.size()) != idx.rows) {
    raise_value_error(
        str_cat("lens: expected ", idx.rows, " entries (the rows of indices), got ", lens.size()));
  }
  std::span<const float> sinks;
  if (!sinks_obj.is_none()) {
    sinks = input_vector<float>(sinks_obj, "sinks", "float32");
    if (sinks.size() != heads) {
      raise_value_error(
          str_cat("sinks: expected ", heads, " entries (one per head), got ", sinks.size()));
    }
  }
  auto [out, out_data] = new_host_array<uint16_t>("q", {tokens, heads, dim}, 0);
  auto [lse, lse_data] = new_host_array<float>("q", {tokens, heads}, 0.0f);
  SparseAttentionParams p;
  p.num_tokens = static_cast<int64_t>(tokens);
  p.num_heads = static_cast<int32_t>(heads);
  p.q = q.data;
  p.swa_cache = input_cache(cache_obj, "swa_cache", block_size, dtype);
  p.swa_indices = {idx.data,   lens.data(), idx.rows,          static_cast<int32_t>(idx.cols),
                   idx.stride, 0,           MemorySpace::kHost};
  p.sinks = sinks.empty() ? nullptr : sinks.data();
  p.softmax_scale = scale;
  p.out = out_data;
  p.lse = lse_data;
  throw_if_error(sparse_attention(p));
  return {out, lse};
}

}  // namespace

void bind_attention(nb::module_& m) {
  m.def("page_layout", &page_layout_dict, nb::arg("block_size").none(),
        nb::arg("dtype").none() = nb::str("fp8_ds_mla"),
        nb::arg("consumer").none() = nb::str("flashmla"),
        "The SWA cache page layout as a dict (block_size, compress_ratio = 1, dtype, consumer,\n"
        "head_size, token_bytes, content_bytes, alignment, page_bytes). block_size: a positive\n"
        "multiple of 32. dtype: \"fp8_ds_mla\", \"bf16\" or \"fp8_e4m3\"; consumer: \"flashmla\"\n"
        "or \"flashinfer\".");
  m.def("compressed_page_layout", &compressed_page_layout_dict, nb::arg("attn_block_size").none(),
        nb::arg("compress_ratio").none(), nb::arg("dtype").none() = nb::str("fp8_ds_mla"),
        nb::arg("consumer").none() = nb::str("flashmla"),
        "The page layout of a compressed cache (C2A, C4A, C128A) as page_layout's dict:\n"
        "pages of attn_block_size // compress_ratio entries (attn_block_size the main-model\n"
        "block, a positive multiple of 32 and of the ratio; compress_ratio 2, 4 or 128), e.g.\n"
        "256 // 4 = 64 for C4A and 256 // 128 = 2 for C128A.");
  m.def("encode_kv", &encode_kv, nb::arg("cache").none(), nb::arg("block_size").none(),
        nb::arg("rows").none(), nb::arg("slots").none(),
        nb::arg("dtype").none() = nb::str("fp8_ds_mla"),
        "Writes rows [n, 512] float32 into a host cache [num_blocks, page_stride_bytes] uint8\n"
        "in place at slots [n] int64 (-1 = skip). The cache's row stride is the page stride;\n"
        "its columns must hold a page's content (page_layout's content_bytes), or ValueError.\n"
        "Device arrays raise NotImplementedError.");
  m.def("decode_kv", &decode_kv, nb::arg("cache").none(), nb::arg("block_size").none(),
        nb::arg("slots").none(), nb::arg("dtype").none() = nb::str("fp8_ds_mla"),
        "Reads slots [n] int64 of a host cache back -> new float32 [n, 512] (slot -1: zeros).");
  m.def("sparse_attention", &attention, nb::arg("q").none(), nb::arg("swa_cache").none(),
        nb::arg("swa_block_size").none(), nb::arg("indices").none(), nb::arg("lens").none(),
        nb::arg("scale") = nb::none(), nb::arg("sinks") = nb::none(),
        nb::arg("dtype").none() = nb::str("fp8_ds_mla"),
        "Sparse MLA attention on the CPU backend (double-precision reference, bf16 output):\n"
        "q [T, H, 512] uint16 bf16 bits, swa_cache [num_blocks, page_stride_bytes] uint8,\n"
        "indices [T, W] int32 slot ids (-1 = skip), lens [T] int32, scale (default 512**-0.5),\n"
        "sinks [H] float32 or None -> (out [T, H, 512] uint16 bf16 bits, lse [T, H] float32;\n"
        "+inf for a row without keys). Host arrays only: device arrays raise\n"
        "NotImplementedError for now.");
}

}  // namespace sparse_swa::python
