// SPDX-License-Identifier: Apache-2.0
#include "sparse_swa/device_copies.h"

#include <cstring>
#include <type_traits>

#include "backend.h"
#include "sparse_swa/metadata_fields.h"

namespace sparse_swa {

namespace {

Status copy_to_host(void* dst, const void* src, size_t bytes, MemorySpace space) {
  if (bytes == 0) return Status::Ok();
  if (space == MemorySpace::kHost) {
    std::memcpy(dst, src, bytes);
    return Status::Ok();
  }
  return detail::cuda_copy_device_to_host(dst, src, bytes);
}

template <typename T>
Status copy_span(std::span<const T>* view, MemorySpace space, std::vector<std::vector<T>>* store) {
  std::vector<T>& dst = store->emplace_back(view->size());
  SPARSE_SWA_RETURN_IF_ERROR(copy_to_host(dst.data(), view->data(), view->size_bytes(), space));
  *view = {dst.data(), dst.size()};
  return Status::Ok();
}

Status copy_view(ConstIndexView* view, std::vector<std::vector<int32_t>>* store) {
  const ConstIndexView src = *view;
  int32_t* rows = store->emplace_back(static_cast<size_t>(src.rows * src.width)).data();
  for (int64_t i = 0; i < src.rows && src.width > 0; ++i) {
    // Row by row: the source stride may exceed the width.
    SPARSE_SWA_RETURN_IF_ERROR(
        copy_to_host(rows + i * src.width, src.row(i), sizeof(int32_t) * src.width, src.space));
  }
  int32_t* lens = store->emplace_back(static_cast<size_t>(src.rows)).data();
  SPARSE_SWA_RETURN_IF_ERROR(
      copy_to_host(lens, src.lens, sizeof(int32_t) * static_cast<size_t>(src.rows), src.space));
  view->data = rows;
  view->lens = lens;
  view->row_stride = src.width;
  view->space = MemorySpace::kHost;
  return Status::Ok();
}

}  // namespace

StatusOr<std::unique_ptr<DeviceBatch>> DeviceBatch::upload(const BatchInput& host) {
  std::unique_ptr<DeviceBatch> d(new DeviceBatch());
  d->host_query_start_loc_.assign(host.query_start_loc.begin(), host.query_start_loc.end());
  d->host_seq_lens_.assign(host.seq_lens.begin(), host.seq_lens.end());
  d->spans_.assign(host.image_spans.begin(), host.image_spans.end());
  const auto& bt = host.block_table;
  const size_t qsl_bytes = host.query_start_loc.size_bytes();
  const size_t seq_bytes = host.seq_lens.size_bytes();
  const size_t bt_bytes = static_cast<size_t>(bt.rows * bt.stride) * sizeof(int32_t);
  const size_t slot_bytes = host.slot_mapping.size_bytes();
  const size_t replay_bytes = host.replay_start.size_bytes();
  // 8-byte aligned sections: slot_mapping is int64.
  auto align8 = [](size_t n) { return (n + 7) / 8 * 8; };
  const size_t off_seq = align8(qsl_bytes), off_bt = off_seq + align8(seq_bytes),
               off_slot = off_bt + align8(bt_bytes), off_replay = off_slot + align8(slot_bytes),
               total = off_replay + align8(replay_bytes) + 8;
  SPARSE_SWA_RETURN_IF_ERROR(detail::cuda_device_alloc(&d->device_, total));
  auto* base = static_cast<char*>(d->device_);
  if (qsl_bytes > 0) {
    SPARSE_SWA_RETURN_IF_ERROR(
        detail::cuda_copy_host_to_device(base, host.query_start_loc.data(), qsl_bytes));
  }
  if (seq_bytes > 0) {
    SPARSE_SWA_RETURN_IF_ERROR(
        detail::cuda_copy_host_to_device(base + off_seq, host.seq_lens.data(), seq_bytes));
  }
  if (bt_bytes > 0) {
    SPARSE_SWA_RETURN_IF_ERROR(detail::cuda_copy_host_to_device(base + off_bt, bt.data, bt_bytes));
  }
  if (slot_bytes > 0) {
    SPARSE_SWA_RETURN_IF_ERROR(
        detail::cuda_copy_host_to_device(base + off_slot, host.slot_mapping.data(), slot_bytes));
  }
  if (replay_bytes > 0) {
    SPARSE_SWA_RETURN_IF_ERROR(detail::cuda_copy_host_to_device(
        base + off_replay, host.replay_start.data(), replay_bytes));
  }
  BatchInput& in = d->input_;
  in = host;
  in.query_start_loc = {reinterpret_cast<const int32_t*>(base), host.query_start_loc.size()};
  in.seq_lens = {reinterpret_cast<const int32_t*>(base + off_seq), host.seq_lens.size()};
  in.block_table.data = reinterpret_cast<const int32_t*>(base + off_bt);
  in.block_table.space = MemorySpace::kDevice;
  in.slot_mapping = {reinterpret_cast<const int64_t*>(base + off_slot), host.slot_mapping.size()};
  in.replay_start = {reinterpret_cast<const int32_t*>(base + off_replay), host.replay_start.size()};
  in.query_start_loc_host = d->host_query_start_loc_;
  in.seq_lens_host = d->host_seq_lens_;
  in.image_spans = d->spans_;
  return d;
}

DeviceBatch::~DeviceBatch() {
  if (device_ != nullptr) detail::cuda_device_free(device_);
}

StatusOr<std::unique_ptr<HostMetadata>> copy_metadata_to_host(const SwaMetadata& md) {
  auto h = std::make_unique<HostMetadata>();
  h->md = md;
  Status status = Status::Ok();
  // Each array is copied once and its view pointed at the copy (the inner vectors' buffers stay
  // put when the outer vectors grow).
  for_each_metadata_field(h->md, [&](const MetadataField& field, auto& value) {
    using T = std::remove_reference_t<decltype(value)>;
    if (!status.ok()) return;
    const MemorySpace space = field.host ? MemorySpace::kHost : md.space;
    if constexpr (std::is_same_v<T, ConstIndexView>) {
      status = copy_view(&value, &h->int32_arrays);
    } else if constexpr (std::is_same_v<T, std::span<const int32_t>>) {
      status = copy_span(&value, space, &h->int32_arrays);
    } else if constexpr (std::is_same_v<T, std::span<const uint8_t>>) {
      status = copy_span(&value, space, &h->uint8_arrays);
    }
  });
  SPARSE_SWA_RETURN_IF_ERROR(status);
  h->md.space = MemorySpace::kHost;
  return h;
}

}  // namespace sparse_swa
