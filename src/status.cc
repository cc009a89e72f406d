// SPDX-License-Identifier: Apache-2.0
#include "sparse_swa/status.h"

#include <algorithm>
#include <vector>

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

std::string_view closest_name(std::string_view name, std::span<const std::string_view> names) {
  constexpr size_t kLongest = 256;  // longer text is no typo of a field name
  std::string_view best;
  size_t best_edits = kLongest;
  if (name.size() > kLongest) return best;
  std::vector<size_t> row, next;
  for (std::string_view candidate : names) {
    if (candidate.size() > kLongest) continue;
    // Levenshtein distance, one row of the table at a time.
    row.resize(candidate.size() + 1);
    next.resize(candidate.size() + 1);
    for (size_t j = 0; j <= candidate.size(); ++j) row[j] = j;
    for (size_t i = 1; i <= name.size(); ++i) {
      next[0] = i;
      for (size_t j = 1; j <= candidate.size(); ++j) {
        const size_t substitute = row[j - 1] + (name[i - 1] == candidate[j - 1] ? 0 : 1);
        next[j] = std::min({row[j] + 1, next[j - 1] + 1, substitute});
      }
      std::swap(row, next);
    }
    const size_t edits = row[candidate.size()];
    const size_t allowed = std::max<size_t>(2, std::max(name.size(), candidate.size()) / 3);
    if (edits <= allowed && edits < best_edits) {
      best = candidate;
      best_edits = edits;
    }
  }
  return best;
}

std::string Status::to_string() const {
  if (ok()) return "OK";
  return std::string(status_code_name(code_)) + ": " + message_;
}

}  // namespace sparse_swa
