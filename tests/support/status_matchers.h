// SPDX-License-Identifier: Apache-2.0
// gtest helpers for Status / StatusOr and for creating builders in tests.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "sparse_swa/metadata_builder.h"
#include "sparse_swa/status.h"

#define SPARSE_SWA_EXPECT_OK(expr)                                                \
  do {                                                                            \
    const ::sparse_swa::Status sparse_swa_expect_ok_ = (expr);                    \
    EXPECT_TRUE(sparse_swa_expect_ok_.ok()) << sparse_swa_expect_ok_.to_string(); \
  } while (0)

#define SPARSE_SWA_ASSERT_OK(expr)                                                \
  do {                                                                            \
    const ::sparse_swa::Status sparse_swa_assert_ok_ = (expr);                    \
    ASSERT_TRUE(sparse_swa_assert_ok_.ok()) << sparse_swa_assert_ok_.to_string(); \
  } while (0)

namespace sparse_swa::testing {

// Success when `status` is INVALID_ARGUMENT and its message contains every fragment, in order.
// Takes a braced list of strings or {begin, end} of a container of strings.
inline ::testing::AssertionResult IsInvalidArgument(const Status& status,
                                                    const std::vector<std::string>& fragments) {
  if (status.code() != StatusCode::kInvalidArgument) {
    return ::testing::AssertionFailure() << "expected INVALID_ARGUMENT, got " << status.to_string();
  }
  size_t from = 0;
  for (const std::string& f : fragments) {
    const size_t at = status.message().find(f, from);
    if (at == std::string::npos) {
      return ::testing::AssertionFailure()
             << "message \"" << status.message() << "\" lacks \"" << f << "\" (in order)";
    }
    from = at + f.size();
  }
  return ::testing::AssertionSuccess() << status.message();
}

// A CPU builder for a config the test knows to be valid; throws (a test failure) otherwise.
inline std::unique_ptr<MetadataBuilder> cpu_builder(const BuilderConfig& config) {
  auto b = MetadataBuilder::create(config, Backend::kCpu);
  if (!b.ok()) throw std::runtime_error("MetadataBuilder::create: " + b.status().to_string());
  return std::move(b).value();
}

}  // namespace sparse_swa::testing
