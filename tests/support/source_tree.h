// SPDX-License-Identifier: Apache-2.0
// Where the tests find the repository's data files (tests/data, examples/batches,
// docs/errors.md), so that the test binary runs wherever it is carried: the folder named by
// $SPARSE_SWA_SOURCE_DIR (ctest sets it), else the nearest folder at or above the working
// directory, else at or above the executable's own folder, that holds both
// tests/data/errors/cases.json and examples/batches. No build-machine path is compiled in.
#pragma once

#include <filesystem>

namespace sparse_swa::testing {

// The source tree's root; empty when none is found (then every data path is relative and the
// tests that read files fail on a missing file; a note on stderr says how to point them).
const std::filesystem::path& source_dir();
std::filesystem::path test_data_dir();  // <root>/tests/data
std::filesystem::path examples_dir();   // <root>/examples/batches

}  // namespace sparse_swa::testing
