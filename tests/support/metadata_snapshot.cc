// SPDX-License-Identifier: Apache-2.0
#include "support/metadata_snapshot.h"

#include <cstring>
#include <sstream>
#include <stdexcept>
#include <type_traits>

#include "sparse_swa/metadata_fields.h"

namespace sparse_swa::testing {

namespace {

void host_copy(void* dst, const void* src, size_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, bytes);
}

template <typename T>
std::vector<int64_t> copy_out(const T* src, size_t count, const CopyToHost& copy) {
  std::vector<std::remove_const_t<T>> v(count);
  if (count > 0) copy(v.data(), src, count * sizeof(T));
  return std::vector<int64_t>(v.begin(), v.end());
}

// Rows [rows, width] of a view whose stride may exceed its width.
std::vector<int64_t> copy_rows(const ConstIndexView& v, const CopyToHost& copy) {
  std::vector<int32_t> out(static_cast<size_t>(v.rows) * v.width);
  for (int64_t i = 0; i < v.rows && v.width > 0; ++i) {
    copy(out.data() + i * v.width, v.row(i), sizeof(int32_t) * v.width);
  }
  return std::vector<int64_t>(out.begin(), out.end());
}

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ",") + n;
  return "[" + out + "]";
}

std::string compare(const MetadataSnapshot::Entry& a, const MetadataSnapshot::Entry& b) {
  std::ostringstream os;
  if (a.name != b.name) {
    os << "entries: " << a.name << " vs " << b.name;
  } else if (a.text != b.text) {
    os << a.name << ": " << a.text << " vs " << b.text;
  } else if (a.scalar && a.values != b.values) {
    os << a.name << ": " << a.values[0] << " vs " << b.values[0];
  } else if (a.values.size() != b.values.size()) {
    os << a.name << ": size " << a.values.size() << " vs " << b.values.size();
  } else {
    for (size_t i = 0; i < a.values.size(); ++i) {
      if (a.values[i] == b.values[i]) continue;
      os << a.name;
      if (a.width > 0) {
        os << "[" << i / a.width << "][" << i % a.width << "]";
      } else {
        os << "[" << i << "]";
      }
      os << ": " << a.values[i] << " vs " << b.values[i];
      break;
    }
  }
  return os.str();
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
  const CopyToHost& device_copy =
      md.space == MemorySpace::kHost ? CopyToHost(host_copy) : copy_to_host;
  MetadataSnapshot s;
  auto add = [&](std::string name, std::vector<int64_t> values, int64_t width = 0) {
    s.entries.push_back({std::move(name), false, std::move(values), width, ""});
  };
  for_each_metadata_field(md, [&](const MetadataField& field, const auto& value) {
    using T = std::remove_cvref_t<decltype(value)>;
    const CopyToHost& copy = field.host ? CopyToHost(host_copy) : device_copy;
    const std::string name = field.name;
    if constexpr (std::is_same_v<T, ConstIndexView>) {
      s.entries.push_back({name + ".width", true, {value.width}, 0, ""});
      s.entries.push_back({name + ".window", true, {value.window}, 0, ""});
      add(name + ".rows", copy_rows(value, copy), value.width);
      add(name + ".lens", copy_out(value.lens, static_cast<size_t>(value.rows), copy));
    } else if constexpr (std::is_same_v<T, std::span<const int32_t>> ||
                         std::is_same_v<T, std::span<const uint8_t>>) {
      add(name, copy_out(value.data(), value.size(), copy));
    } else if constexpr (std::is_same_v<T, LayerTypeSet>) {
      s.entries.push_back({name, true, {}, 0, join(value.sorted_names())});
    } else {
      s.entries.push_back({name, true, {static_cast<int64_t>(value)}, 0, ""});
    }
  });
  return s;
}

template <typename Snapshot>
auto& values_of(Snapshot& s, std::string_view name) {
  for (auto& e : s.entries) {
    if (e.name == name) return e.values;
  }
  throw std::out_of_range("MetadataSnapshot: no entry " + std::string(name));
}

std::vector<int64_t>& MetadataSnapshot::at(std::string_view name) { return values_of(*this, name); }

const std::vector<int64_t>& MetadataSnapshot::at(std::string_view name) const {
  return values_of(*this, name);
}

std::vector<int32_t> MetadataSnapshot::ints(std::string_view name) const {
  const std::vector<int64_t>& v = at(name);
  return std::vector<int32_t>(v.begin(), v.end());
}

std::string first_difference(const MetadataSnapshot& a, const MetadataSnapshot& b) {
  if (a.entries.size() != b.entries.size()) {
    return "entries: " + std::to_string(a.entries.size()) + " vs " +
           std::to_string(b.entries.size());
  }
  for (size_t i = 0; i < a.entries.size(); ++i) {
    const std::string d = compare(a.entries[i], b.entries[i]);
    if (!d.empty()) return d;
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
