// SPDX-License-Identifier: Apache-2.0
// Status and StatusOr: every fallible library call returns one of these instead of throwing,
// aborting or trapping. Messages name the field, the expected and the actual value.
#pragma once

#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>

namespace sparse_swa {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // the caller's config or batch is malformed
  kUnimplemented,    // a valid request this build or backend does not support
  kUnavailable,      // a resource is missing (no GPU, no CUDA build)
  kInternal,         // a CUDA runtime error or a broken invariant inside the library
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "INVALID_ARGUMENT: batch.seq_lens[1]: ..." (or "OK").
  std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// Builds a message from streamable parts: invalid_argument("batch.seq_lens[", i, "]: ...").
template <typename... Parts>
std::string str_cat(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}

// User text made safe to quote in a message: printable ASCII and valid UTF-8 kept, other bytes
// written as \xNN, cut after `max_bytes` with the total length noted.
std::string printable_excerpt(std::string_view text, size_t max_bytes = 64);
// The same status with its message passed through printable_excerpt (limit 300 bytes).
Status with_printable_message(const Status& status);
// The entry of `names` closest to `name` in single-character edits, for "did you mean" hints
// ("windw_size" -> "window_size"); empty when the closest needs more than max(2, size / 3)
// edits (size: the longer of the two).
std::string_view closest_name(std::string_view name, std::span<const std::string_view> names);

template <typename... Parts>
Status invalid_argument(const Parts&... parts) {
  return Status(StatusCode::kInvalidArgument, str_cat(parts...));
}
template <typename... Parts>
Status unimplemented(const Parts&... parts) {
  return Status(StatusCode::kUnimplemented, str_cat(parts...));
}
template <typename... Parts>
Status unavailable(const Parts&... parts) {
  return Status(StatusCode::kUnavailable, str_cat(parts...));
}
template <typename... Parts>
Status internal_error(const Parts&... parts) {
  return Status(StatusCode::kInternal, str_cat(parts...));
}

// A value or the error that prevented it. value() on an error is a caller bug; check ok() first.
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(Status status) : status_(std::move(status)) {}  // NOLINT: implicit by design
  StatusOr(T value) : value_(std::move(value)) {}          // NOLINT: implicit by design

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace sparse_swa

// Returns early from a function that returns Status (or StatusOr) when `expr` fails.
#define SPARSE_SWA_RETURN_IF_ERROR(expr)                     \
  do {                                                       \
    ::sparse_swa::Status sparse_swa_status_ = (expr);        \
    if (!sparse_swa_status_.ok()) return sparse_swa_status_; \
  } while (0)
