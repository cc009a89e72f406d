#include "sparse_swa/status.h"

namespace sparse_swa {

const char* status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "OK";
    case StatusCode::kInvalidArgument:
      return "INVALID_ARGUMENT";
    case StatusCode::kUnimplemented:
      return "UNIMPLEMENTED";
    case StatusCode::kUnavailable:
      return "UNAVAILABLE";
    case StatusCode::kInternal:
      return "INTERNAL";
  }
  return "UNKNOWN";
}

namespace {
// Length of the valid UTF-8 sequence starting at s[i] (1 for ASCII), 0 if invalid.
size_t utf8_sequence(std::string_view s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  const size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((static_cast<unsigned char>(s[i + k]) >> 6) != 2) return 0;
  }
  return n;
}
}  // namespace

std::string printable_excerpt(std::string_view text, size_t max_bytes) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  size_t i = 0;
  while (i < text.size() && out.size() < max_bytes) {
    const auto c = static_cast<unsigned char>(text[i]);
    const size_t n = utf8_sequence(text, i);
    if (n == 1 && c >= 0x20 && c != 0x7f) {
      out += static_cast<char>(c);
    } else if (n > 1) {
      out.append(text.substr(i, n));
      i += n;
      continue;
    } else {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
    ++i;
  }
  if (i < text.size()) out += str_cat("... (", text.size(), " bytes)");
  return out;
}

Status with_printable_message(const Status& status) {
  if (status.ok()) return status;
  return Status(status.code(), printable_excerpt(status.message(), 300));
}

std::string Status::to_string() const {
  if (ok()) return "OK";
  return std::string(status_code_name(code_)) + ": " + message_;
}

}  // namespace sparse_swa
