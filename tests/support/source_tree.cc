// SPDX-License-Identifier: Apache-2.0
#include "support/source_tree.h"

#include <cstdio>
#include <cstdlib>
#include <system_error>

namespace sparse_swa::testing {

namespace {

namespace fs = std::filesystem;

bool holds_the_data(const fs::path& root) {
  std::error_code ec;
  return fs::is_regular_file(root / "tests" / "data" / "errors" / "cases.json", ec) &&
         fs::is_directory(root / "examples" / "batches", ec);
}

// `start` and its parents, nearest first; empty when none holds the data.
fs::path search_up(fs::path start) {
  std::error_code ec;
  start = fs::absolute(start, ec);
  if (ec) return {};
  for (fs::path p = start; !p.empty(); p = p.parent_path()) {
    if (holds_the_data(p)) return p;
    if (p == p.parent_path()) break;
  }
  return {};
}

fs::path find_source_dir() {
  if (const char* env = std::getenv("SPARSE_SWA_SOURCE_DIR"); env != nullptr && *env != '\0') {
    if (holds_the_data(env)) return fs::path(env);
    std::fprintf(stderr,
                 "sparse_swa tests: SPARSE_SWA_SOURCE_DIR=%s holds no tests/data/errors/cases.json "
                 "and examples/batches\n",
                 env);
    return {};
  }
  std::error_code ec;
  if (fs::path p = search_up(fs::current_path(ec)); !p.empty()) return p;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);  // Linux; elsewhere skipped
  if (!ec) {
    if (fs::path p = search_up(exe.parent_path()); !p.empty()) return p;
  }
  std::fprintf(stderr,
               "sparse_swa tests: no source tree (tests/data and examples/batches) at or above the "
               "working directory or the executable; run from the repository or set "
               "SPARSE_SWA_SOURCE_DIR\n");
  return {};
}

}  // namespace

const fs::path& source_dir() {
  static const fs::path root = find_source_dir();
  return root;
}

fs::path test_data_dir() { return source_dir() / "tests" / "data"; }
fs::path examples_dir() { return source_dir() / "examples" / "batches"; }

}  // namespace sparse_swa::testing
