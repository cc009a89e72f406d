// SPDX-License-Identifier: Apache-2.0
#include "attention_binding.h"

#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <climits>
#include <span>
#include <string>
#include <tuple>
#include <utility>

#include "array_input.h"
#include "call_arrays.h"
#include "python_values.h"
#include "sparse_swa/attention.h"
#include "sparse_swa/kv_cache.h"
#include "status_exceptions.h"

namespace sparse_swa::python {

namespace {

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

// A [num_blocks, >= content bytes] uint8 cache at the call's place: the row stride is the page
// stride, and the columns must hold a page's content (the library reads and writes all of it).
template <typename Void, typename Array>
BasicKvCacheView<Void> cache_view(const Array& a, std::string_view field, int32_t block_size,
                                  CacheDtype d, MemorySpace space) {
  const FlatMatrix m = flat_matrix(a, field, {Elem::kUint8}, 2);
  const int64_t content = int64_t{block_size} * cache_token_bytes(d);
  if (block_size >= 1 && m.cols < content) {
    raise_value_error(str_cat(field, ": expected >= ", content, " columns (block_size ", block_size,
                              " * ", cache_token_bytes(d), " bytes of ", cache_dtype_name(d),
                              ", a page's content), got ", m.cols));
  }
  const int64_t stride = a.shape(0) > 1 ? m.stride : m.cols;
  return {m.data, m.rows, block_size, stride, d, space};
}

// 1-D inputs at the call's place.
template <typename T>
std::span<const T> vector_at(nb::handle obj, std::string_view field, Elem elem,
                             const CallPlace& call) {
  return vector_of<T>(import_at(obj, field, call), field, elem);
}

void encode_kv(nb::handle cache_obj, nb::handle block_size_obj, nb::handle rows_obj,
               nb::handle slots_obj, nb::handle dtype, nb::handle stream) {
  const int32_t block_size = int32_from_python(block_size_obj, "block_size");
  const CacheDtype d = dtype_from(dtype);
  CallPlace call;
  const nb::ndarray<>& cache_array = import_writable_anchor(cache_obj, "cache", &call);
  const KvCacheView cache = cache_view<void>(cache_array, "cache", block_size, d, call.space());
  const FlatMatrix rows = flat_matrix(import_at(rows_obj, "rows", call), "rows",
                                      {Elem::kFloat32, Elem::kBf16, Elem::kUint16}, 2);
  const std::span<const int64_t> slots = vector_at<int64_t>(slots_obj, "slots", Elem::kInt64, call);
  if (static_cast<int64_t>(slots.size()) != rows.rows) {
    raise_value_error(
        str_cat("slots: expected ", rows.rows, " entries (the rows of rows), got ", slots.size()));
  }
  KvCodecOptions options;
  options.cuda_stream = stream_from(stream, call, nullptr);
  if (rows.elem == Elem::kFloat32) {
    throw_if_error(encode_kv_rows(typed<const float>(rows, call.space()), slots, cache, options));
  } else {
    throw_if_error(
        encode_kv_rows_bf16(typed<const uint16_t>(rows, call.space()), slots, cache, options));
  }
}

nb::object decode_kv(nb::handle cache_obj, nb::handle block_size_obj, nb::handle slots_obj,
                     nb::handle dtype, nb::handle out_obj, nb::handle stream) {
  const int32_t block_size = int32_from_python(block_size_obj, "block_size");
  CallPlace call;
  const InputArray& cache_array = import_anchor(cache_obj, "cache", &call);
  const ConstKvCacheView cache =
      cache_view<const void>(cache_array, "cache", block_size, dtype_from(dtype), call.space());
  const std::span<const int64_t> slots = vector_at<int64_t>(slots_obj, "slots", Elem::kInt64, call);
  const auto n = static_cast<int64_t>(slots.size());
  nb::object out;
  MatrixView<float> view;
  if (out_obj.is_none()) {
    const NewArray a = new_array(call, Elem::kFloat32,
                                 {slots.size(), static_cast<size_t>(kHeadDim)}, "out", "slots");
    out = a.array;
    view = {static_cast<float*>(a.data), n, kHeadDim, kHeadDim, call.space()};
  } else {
    const FlatMatrix m =
        flat_matrix(import_writable_at(out_obj, "out", call), "out", {Elem::kFloat32}, 2);
    if (m.rows != n || m.cols != kHeadDim) {
      raise_value_error(str_cat("out: expected shape [", n, ", ", kHeadDim, "] (slots, 512), got [",
                                m.rows, ", ", m.cols, "]"));
    }
    out = nb::borrow(out_obj);
    view = typed<float>(m, call.space());
  }
  KvCodecOptions options;
  options.cuda_stream = stream_from(stream, call, nullptr);
  throw_if_error(decode_kv_rows(cache, slots, view, options));
  return out;
}

// One index segment: the cache, its rows [T, W] (or [T, 1, W]) and lens [T].
struct Segment {
  ConstKvCacheView cache;
  ConstIndexView indices;
};

Segment segment_at(const CallPlace& call, nb::handle cache_obj, const char* cache_field,
                   int32_t block_size, CacheDtype d, nb::handle indices_obj,
                   const char* indices_field, nb::handle lens_obj, const char* lens_field,
                   int64_t tokens) {
  Segment s;
  s.cache = cache_view<const void>(import_at(cache_obj, cache_field, call), cache_field, block_size,
                                   d, call.space());
  const MatrixView<const int32_t> idx =
      index_rows(import_at(indices_obj, indices_field, call), indices_field, call.space());
  if (idx.rows != tokens) {
    raise_value_error(
        str_cat(indices_field, ": expected ", tokens, " rows (the tokens of q), got ", idx.rows));
  }
  const std::span<const int32_t> lens =
      vector_at<int32_t>(lens_obj, lens_field, Elem::kInt32, call);
  if (static_cast<int64_t>(lens.size()) != idx.rows) {
    raise_value_error(str_cat(lens_field, ": expected ", idx.rows, " entries (the rows of ",
                              indices_field, "), got ", lens.size()));
  }
  s.indices = {idx.data,   lens.data(), idx.rows,    static_cast<int32_t>(idx.cols),
               idx.stride, 0,           call.space()};
  return s;
}

// The library's messages name its params fields; the Python arguments are named instead.
Status renamed(const Status& status) {
  return renamed_fields(status, {{"params.swa_indices.lens", "lens"},
                                 {"params.swa_indices", "indices"},
                                 {"params.extra_indices.lens", "extra_lens"},
                                 {"params.extra_indices", "extra_indices"},
                                 {"params.swa_cache", "swa_cache"},
                                 {"params.extra_cache", "extra_cache"},
                                 {"params.sinks", "sinks"},
                                 {"params.out", "out"},
                                 {"params.lse", "lse"},
                                 {"params.q", "q"},
                                 {"params.num_heads", "q"},
                                 {"params.num_tokens", "q"},
                                 {"params.softmax_scale", "scale"},
                                 {"params.query_group_size", "query_group_size"},
                                 {"params.workspace_bytes", "workspace"},
                                 {"params.workspace", "workspace"},
                                 {"params.pointers_device", "the arrays' device"}});
}

struct AttentionArgs {
  nb::handle extra_cache, extra_block_size, extra_indices, extra_lens, out, lse, stream, kernel,
      query_group_size, workspace;
};

AttentionKernel kernel_from(nb::handle value) {
  auto k = parse_attention_kernel(string_from_python(value, "kernel"));
  throw_if_error(k.status());
  return k.value();
}

// The params both sparse_attention and attention_workspace_bytes take from their arguments: q's
// shape, the segments, the kernel choice and the query-group hint, every shape checked (the
// outputs, scale, sinks and workspace are sparse_attention's alone), and q's element type.
struct CallParams {
  SparseAttentionParams p;
  Elem q_elem;
};
CallParams call_params(nb::handle q_obj, nb::handle cache_obj, nb::handle block_size_obj,
                       nb::handle indices_obj, nb::handle lens_obj, nb::handle dtype,
                       const AttentionArgs& k, CallPlace* call) {
  const int32_t block_size = int32_from_python(block_size_obj, "swa_block_size");
  const CacheDtype d = dtype_from(dtype);
  const InputArray& q_array = import_anchor(q_obj, "q", call);
  const FlatMatrix q = flat_matrix(q_array, "q", {Elem::kBf16, Elem::kUint16}, 3);
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
  const auto t = static_cast<int64_t>(tokens);
  SparseAttentionParams p;
  p.num_tokens = t;
  p.num_heads = static_cast<int32_t>(heads);
  p.q = static_cast<const uint16_t*>(q.data);
  const Segment swa = segment_at(*call, cache_obj, "swa_cache", block_size, d, indices_obj,
                                 "indices", lens_obj, "lens", t);
  p.swa_cache = swa.cache;
  p.swa_indices = swa.indices;
  const bool has_extra =
      !k.extra_cache.is_none() || !k.extra_indices.is_none() || !k.extra_lens.is_none();
  if (has_extra) {
    for (const auto& [obj, name] :
         {std::pair{k.extra_cache, "extra_cache"}, std::pair{k.extra_indices, "extra_indices"},
          std::pair{k.extra_lens, "extra_lens"}}) {
      if (obj.is_none()) {
        raise_value_error(str_cat(name,
                                  ": required with the other extra_* arguments (the "
                                  "compressed segment), got None"));
      }
    }
    const int32_t extra_block = k.extra_block_size.is_none()
                                    ? block_size
                                    : int32_from_python(k.extra_block_size, "extra_block_size");
    const Segment extra =
        segment_at(*call, k.extra_cache, "extra_cache", extra_block, d, k.extra_indices,
                   "extra_indices", k.extra_lens, "extra_lens", t);
    p.extra_cache = extra.cache;
    p.extra_indices = extra.indices;
  }
  p.kernel = kernel_from(k.kernel);
  p.query_group_size = int32_from_python(k.query_group_size, "query_group_size");
  if (call->on_device()) {
    p.pointers_device = call->place.device_id;  // every array came through DLPack from this device
  }
  return {p, q.elem};
}

std::tuple<nb::object, nb::object> attention(nb::handle q_obj, nb::handle cache_obj,
                                             nb::handle block_size_obj, nb::handle indices_obj,
                                             nb::handle lens_obj, nb::handle scale_obj,
                                             nb::handle sinks_obj, nb::handle dtype,
                                             const AttentionArgs& k) {
  const float scale =
      scale_obj.is_none() ? kDefaultSoftmaxScale : float_from_python(scale_obj, "scale");
  CallPlace call;
  auto [p, q_elem] =
      call_params(q_obj, cache_obj, block_size_obj, indices_obj, lens_obj, dtype, k, &call);
  const int64_t t = p.num_tokens;
  const auto tokens = static_cast<size_t>(t);
  const auto heads = static_cast<size_t>(p.num_heads);
  const auto dim = static_cast<size_t>(kHeadDim);
  if (!sinks_obj.is_none()) {
    const std::span<const float> sinks = vector_at<float>(sinks_obj, "sinks", Elem::kFloat32, call);
    if (sinks.size() != heads) {
      raise_value_error(
          str_cat("sinks: expected ", heads, " entries (one per head), got ", sinks.size()));
    }
    p.sinks = sinks.data();
  }
  p.softmax_scale = scale;
  nb::object out, lse;
  if (k.out.is_none()) {
    const NewArray a = new_array(call, q_elem, {tokens, heads, dim}, "out", "q");
    out = a.array;
    p.out = static_cast<uint16_t*>(a.data);
  } else {
    const FlatMatrix m =
        flat_matrix(import_writable_at(k.out, "out", call), "out", {Elem::kBf16, Elem::kUint16}, 3);
    if (m.rows != t || m.cols != static_cast<int64_t>(heads * dim) ||
        (t > 1 && m.stride != m.cols)) {
      raise_value_error(str_cat("out: expected a contiguous [", tokens, ", ", heads, ", ", dim,
                                "] array like q"));
    }
    out = nb::borrow(k.out);
    p.out = static_cast<uint16_t*>(m.data);
  }
  if (k.lse.is_none()) {
    const NewArray a = new_array(call, Elem::kFloat32, {tokens, heads}, "lse", "q");
    lse = a.array;
    p.lse = static_cast<float*>(a.data);
  } else {
    const FlatMatrix m =
        flat_matrix(import_writable_at(k.lse, "lse", call), "lse", {Elem::kFloat32}, 2);
    if (m.rows != t || m.cols != static_cast<int64_t>(heads) || (t > 1 && m.stride != m.cols)) {
      raise_value_error(
          str_cat("lse: expected a contiguous [", tokens, ", ", heads, "] float32 array"));
    }
    lse = nb::borrow(k.lse);
    p.lse = static_cast<float*>(m.data);
  }
  void* stream = stream_from(k.stream, call, nullptr);
  if (!k.workspace.is_none()) {
    // The caller's scratch (sized by sparse_attention_workspace_bytes) instead of the module's;
    // imported writable, so its bytes may be written.
    const auto bytes =
        flat_vector(import_writable_at(k.workspace, "workspace", call), "workspace", Elem::kUint8);
    p.workspace = const_cast<std::byte*>(bytes.data());
    p.workspace_bytes = static_cast<int64_t>(bytes.size());
  } else if (call.on_device()) {
    const auto [workspace, bytes] = attention_workspace(call.place.device_id, stream);
    p.workspace = workspace;
    p.workspace_bytes = bytes;
  }
  throw_if_error(renamed(sparse_attention(p, stream)));
  return {out, lse};
}

int64_t attention_workspace_bytes(nb::handle q_obj, nb::handle cache_obj, nb::handle block_size_obj,
                                  nb::handle indices_obj, nb::handle lens_obj, nb::handle dtype,
                                  const AttentionArgs& k) {
  CallPlace call;
  const CallParams c =
      call_params(q_obj, cache_obj, block_size_obj, indices_obj, lens_obj, dtype, k, &call);
  return call.on_device() ? sparse_attention_workspace_bytes(c.p) : 0;
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
        nb::arg("dtype").none() = nb::str("fp8_ds_mla"), nb::kw_only(),
        nb::arg("stream") = nb::none(),
        "Writes rows [n, 512] (float32, or bfloat16 / uint16 bf16 bits) into a cache\n"
        "[num_blocks, page_stride_bytes] uint8 in place at slots [n] int64 (-1 = skip). The\n"
        "cache's row stride is the page stride; its columns must hold a page's content\n"
        "(page_layout's content_bytes), or ValueError. Host arrays run the CPU codec, CUDA\n"
        "arrays the CUDA codec on `stream` (see sparse_attention); all on one device.");
  m.def("decode_kv", &decode_kv, nb::arg("cache").none(), nb::arg("block_size").none(),
        nb::arg("slots").none(), nb::arg("dtype").none() = nb::str("fp8_ds_mla"), nb::kw_only(),
        nb::arg("out") = nb::none(), nb::arg("stream") = nb::none(),
        "Reads slots [n] int64 of a cache back -> float32 [n, 512] (slot -1: zeros), written\n"
        "into `out` when given, else a new array in the cache's framework and device.");
  m.def(
      "sparse_attention",
      [](nb::handle q, nb::handle cache, nb::handle block_size, nb::handle indices, nb::handle lens,
         nb::handle scale, nb::handle sinks, nb::handle dtype, nb::handle extra_cache,
         nb::handle extra_block_size, nb::handle extra_indices, nb::handle extra_lens,
         nb::handle out, nb::handle lse, nb::handle stream, nb::handle kernel,
         nb::handle query_group_size, nb::handle workspace) {
        return attention(q, cache, block_size, indices, lens, scale, sinks, dtype,
                         {extra_cache, extra_block_size, extra_indices, extra_lens, out, lse,
                          stream, kernel, query_group_size, workspace});
      },
      nb::arg("q").none(), nb::arg("swa_cache").none(), nb::arg("swa_block_size").none(),
      nb::arg("indices").none(), nb::arg("lens").none(), nb::arg("scale") = nb::none(),
      nb::arg("sinks") = nb::none(), nb::arg("dtype").none() = nb::str("fp8_ds_mla"), nb::kw_only(),
      nb::arg("extra_cache") = nb::none(), nb::arg("extra_block_size") = nb::none(),
      nb::arg("extra_indices") = nb::none(), nb::arg("extra_lens") = nb::none(),
      nb::arg("out") = nb::none(), nb::arg("lse") = nb::none(), nb::arg("stream") = nb::none(),
      nb::arg("kernel").none() = nb::str("auto"), nb::arg("query_group_size") = 1,
      nb::arg("workspace") = nb::none(),
      "Sparse MLA attention over the SWA segment and an optional compressed (extra) segment:\n"
      "q [T, H, 512] bfloat16 (or uint16 bf16 bits), swa_cache [num_blocks, page_stride_bytes]\n"
      "uint8, indices [T, W] or [T, 1, W] int32 slot ids (-1 = skip; the builder's arrays as\n"
      "they are), lens [T] int32, scale (default 512**-0.5), sinks [H] float32 or None;\n"
      "extra_cache / extra_indices / extra_lens (all or none) the compressed segment with its\n"
      "own extra_block_size (default swa_block_size) -> (out [T, H, 512] of q's dtype, lse\n"
      "[T, H] float32, +inf for a row without keys). out= and lse= are written in place when\n"
      "given, else allocated in q's framework on q's device.\n\n"
      "Host arrays run the CPU reference (double accumulation); CUDA arrays (one device, the\n"
      "current one) the CUDA kernels, asynchronously on `stream`: None = torch's current\n"
      "stream for torch tensors, else the legacy default stream; an int (cudaStream_t) or an\n"
      "object with .cuda_stream or __cuda_stream__(). workspace: a writable contiguous uint8\n"
      "array on q's device, 16-byte aligned, that the call may use as scratch (size it with\n"
      "sparse_attention_workspace_bytes; reused by every call on the same stream); None = the\n"
      "module's own split-KV workspace, allocated once per (device, stream) and cached, too\n"
      "small for query groups or decoded keys on large shapes. kernel: \"auto\" (the choice from "
      "the shapes), or\n"
      "\"sm90_tile32\" / \"sm90_pairs\" to force a family of the sm_90a tensor-core kernels\n"
      "(tests, measurements; an error where it cannot run); host arrays have one path and\n"
      "ignore it. query_group_size (1..8):\n"
      "a hint that rows g k .. g k + g - 1 are tokens of one request (MTP / DSpark steps) whose\n"
      "keys overlap, so the CUDA kernel may load each shared key once for the group; the\n"
      "results do not depend on it beyond rounding.");
  m.def(
      "sparse_attention_workspace_bytes",
      [](nb::handle q, nb::handle cache, nb::handle block_size, nb::handle indices, nb::handle lens,
         nb::handle dtype, nb::handle extra_cache, nb::handle extra_block_size,
         nb::handle extra_indices, nb::handle extra_lens, nb::handle kernel,
         nb::handle query_group_size) {
        return attention_workspace_bytes(
            q, cache, block_size, indices, lens, dtype,
            {extra_cache, extra_block_size, extra_indices, extra_lens, nb::none(), nb::none(),
             nb::none(), kernel, query_group_size, nb::none()});
      },
      nb::arg("q").none(), nb::arg("swa_cache").none(), nb::arg("swa_block_size").none(),
      nb::arg("indices").none(), nb::arg("lens").none(),
      nb::arg("dtype").none() = nb::str("fp8_ds_mla"), nb::kw_only(),
      nb::arg("extra_cache") = nb::none(), nb::arg("extra_block_size") = nb::none(),
      nb::arg("extra_indices") = nb::none(), nb::arg("extra_lens") = nb::none(),
      nb::arg("kernel").none() = nb::str("auto"), nb::arg("query_group_size") = 1,
      "The workspace bytes sparse_attention with these arguments would use on the current\n"
      "device (split keys, query groups' key lists, decoded keys' bf16 copy of the caches:\n"
      "docs/design.md#decoded-keys); the arrays' shapes, dtypes and device checked as\n"
      "sparse_attention checks them; 0 for host arrays or when the call needs none. From shapes\n"
      "only, never the arrays' contents (no sync), so an engine\n"
      "can size a workspace = torch.empty(n, dtype=torch.uint8, device=...) once for its largest\n"
      "step and pass it as sparse_attention(..., workspace=workspace).");
}

}  // namespace sparse_swa::python
