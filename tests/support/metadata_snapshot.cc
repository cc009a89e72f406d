#include "support/metadata_snapshot.h"

#include <cstring>
#include <sstream>

namespace sparse_swa::testing {

namespace {

void host_copy(void* dst, const void* src, size_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, bytes);
}

template <typename T>
std::vector<std::remove_const_t<T>> copy_out(const T* src, size_t count, const CopyToHost& copy) {
  std::vector<std::remove_const_t<T>> v(count);
  if (count > 0) copy(v.data(), src, count * sizeof(T));
  return v;
}

// Rows [rows, width] of a view whose stride may exceed its width.
std::vector<int32_t> copy_rows(const ConstIndexView& v, const CopyToHost& copy) {
  std::vector<int32_t> out(static_cast<size_t>(v.rows) * v.width);
  for (int64_t i = 0; i < v.rows && v.width > 0; ++i) {
    copy(out.data() + i * v.width, v.row(i), sizeof(int32_t) * v.width);
  }
  return out;
}

template <typename T>
std::string compare_vectors(const char* name, const std::vector<T>& a, const std::vector<T>& b,
                            int32_t width = 0) {
  std::ostringstream os;
  if (a.size() != b.size()) {
    os << name << ": size " << a.size() << " vs " << b.size();
    return os.str();
  }
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) {
      os << name;
      if (width > 0) {
        os << "[" << i / width << "][" << i % width << "]";
      } else {
        os << "[" << i << "]";
      }
      os << ": " << +a[i] << " vs " << +b[i];
      return os.str();
    }
  }
  return "";
}

}  // namespace

std::vector<int32_t> row_of(const ConstIndexView& view, int64_t i) {
  return std::vector<int32_t>(view.row(i), view.row(i) + view.width);
}

std::vector<int32_t> lens_of(const ConstIndexView& view) {
  return std::vector<int32_t>(view.lens, view.lens + view.rows);
}

std::vector<int32_t> to_vector(std::span<const int32_t> s) {
  return std::vector<int32_t>(s.begin(), s.end());
}

MetadataSnapshot snapshot(const SwaMetadata& md) { return snapshot(md, host_copy); }

MetadataSnapshot snapshot(const SwaMetadata& md, const CopyToHost& copy_to_host) {
  const CopyToHost& copy = md.space == MemorySpace::kHost ? CopyToHost(host_copy) : copy_to_host;
  MetadataSnapshot s;
  s.causal = md.causal;
  s.num_reqs = md.num_reqs;
  s.num_tokens = md.num_tokens;
  s.num_decodes = md.num_decodes;
  s.num_prefills = md.num_prefills;
  s.num_decode_tokens = md.num_decode_tokens;
  s.num_prefill_tokens = md.num_prefill_tokens;
  s.max_decode_query_len = md.max_decode_query_len;
  s.token_to_req = copy_out(md.token_to_req_indices.data(), md.token_to_req_indices.size(), copy);
  s.is_valid = copy_out(md.is_valid_token.data(), md.is_valid_token.size(), copy);
  s.decode_width = md.decode_swa.width;
  s.decode_window = md.decode_swa.window;
  s.decode_rows = copy_rows(md.decode_swa, copy);
  s.decode_lens = copy_out(md.decode_swa.lens, md.decode_swa.rows, copy);
  s.prefill_width = md.prefill_swa.width;
  s.prefill_window = md.prefill_swa.window;
  s.prefill_rows = copy_rows(md.prefill_swa, copy);
  s.prefill_lens = copy_out(md.prefill_swa.lens, md.prefill_swa.rows, copy);
  s.has_image = md.has_image();
  s.left_visible = copy_out(md.left_visible.data(), md.left_visible.size(), copy);
  s.right_visible = copy_out(md.right_visible.data(), md.right_visible.size(), copy);
  s.gather_lens = copy_out(md.prefill_gather_lens.data(), md.prefill_gather_lens.size(), copy);
  s.prefill_seq_lens_host = to_vector(md.prefill_seq_lens_host);
  s.prefill_query_lens_host = to_vector(md.prefill_query_lens_host);
  s.tile_schedulers = md.tile_schedulers.sorted_names();
  return s;
}

std::string first_difference(const MetadataSnapshot& a, const MetadataSnapshot& b) {
  std::ostringstream os;
#define SPARSE_SWA_COMPARE_SCALAR(field)                  \
  if (a.field != b.field) {                               \
    os << #field << ": " << a.field << " vs " << b.field; \
    return os.str();                                      \
  }
  SPARSE_SWA_COMPARE_SCALAR(causal)
  SPARSE_SWA_COMPARE_SCALAR(num_reqs)
  SPARSE_SWA_COMPARE_SCALAR(num_tokens)
  SPARSE_SWA_COMPARE_SCALAR(num_decodes)
  SPARSE_SWA_COMPARE_SCALAR(num_prefills)
  SPARSE_SWA_COMPARE_SCALAR(num_decode_tokens)
  SPARSE_SWA_COMPARE_SCALAR(num_prefill_tokens)
  SPARSE_SWA_COMPARE_SCALAR(max_decode_query_len)
  SPARSE_SWA_COMPARE_SCALAR(decode_width)
  SPARSE_SWA_COMPARE_SCALAR(decode_window)
  SPARSE_SWA_COMPARE_SCALAR(prefill_width)
  SPARSE_SWA_COMPARE_SCALAR(prefill_window)
  SPARSE_SWA_COMPARE_SCALAR(has_image)
#undef SPARSE_SWA_COMPARE_SCALAR
  for (const std::string& d : {
           compare_vectors("token_to_req", a.token_to_req, b.token_to_req),
           compare_vectors("is_valid", a.is_valid, b.is_valid),
           compare_vectors("decode_lens", a.decode_lens, b.decode_lens),
           compare_vectors("decode_rows", a.decode_rows, b.decode_rows, a.decode_width),
           compare_vectors("prefill_lens", a.prefill_lens, b.prefill_lens),
           compare_vectors("prefill_rows", a.prefill_rows, b.prefill_rows, a.prefill_width),
           compare_vectors("left_visible", a.left_visible, b.left_visible),
           compare_vectors("right_visible", a.right_visible, b.right_visible),
           compare_vectors("gather_lens", a.gather_lens, b.gather_lens),
           compare_vectors("prefill_seq_lens_host", a.prefill_seq_lens_host,
                           b.prefill_seq_lens_host),
           compare_vectors("prefill_query_lens_host", a.prefill_query_lens_host,
                           b.prefill_query_lens_host),
       }) {
    if (!d.empty()) return d;
  }
  if (a.tile_schedulers != b.tile_schedulers) {
    auto join = [](const std::vector<std::string>& names) {
      std::string out;
      for (const auto& n : names) out += (out.empty() ? "" : ",") + n;
      return "[" + out + "]";
    };
    os << "tile_schedulers: " << join(a.tile_schedulers) << " vs " << join(b.tile_schedulers);
    return os.str();
  }
  return "";
}

BufferImage capture_buffers(const SwaMetadata& md, int32_t capacity) {
  BufferImage img;
  const size_t n = static_cast<size_t>(capacity);
  auto rows = [n](const ConstIndexView& v) {
    return std::vector<int32_t>(v.data, v.data + n * v.row_stride);
  };
  img.decode_rows = rows(md.decode_swa);
  img.decode_lens.assign(md.decode_swa.lens, md.decode_swa.lens + n);
  img.prefill_rows = rows(md.prefill_swa);
  img.prefill_lens.assign(md.prefill_swa.lens, md.prefill_swa.lens + n);
  img.token_to_req.assign(md.token_to_req_indices.data(), md.token_to_req_indices.data() + n);
  img.is_valid.assign(md.is_valid_token.data(), md.is_valid_token.data() + n);
  return img;
}

}  // namespace sparse_swa::testing
