#pragma once
/// googletest integration: one line in an author's test file certifies their wrapper.
///
///   #include <wrapcert/certify/certify_gtest.h>
///   WRAPCERT_CERTIFY_TEST(MyShard, CertifiedAgainstWrapcert, my_shard_kind());
///
/// Each failed property becomes a googletest failure with its shrunk counterexample.

#include <wrapcert/certify/certify.h>

#include <gtest/gtest.h>

namespace wrapcert::certify {

/// Adds a googletest failure for every failed entry of `report`.
inline void expect_certified(const Report& report) {
  for (const auto& e : report.entries) {
    if (e.status != Status::kFailed) continue;
    ADD_FAILURE() << e.kind << " fails " << e.property << " on " << e.target << ": " << e.reason
                  << (e.key.empty() ? "" : " at '" + e.key + "'") << "\n"
                  << e.counterexample;
  }
  ::testing::Test::RecordProperty("certify_seed", std::to_string(report.options.seed));
}

}  // namespace wrapcert::certify

/// Defines a test that certifies a wrapper kind: the arguments are those of `certify(...)`.
#define WRAPCERT_CERTIFY_TEST(Suite, Name, ...)                                   \
  TEST(Suite, Name) {                                                             \
    ::wrapcert::certify::expect_certified(::wrapcert::certify::run(__VA_ARGS__)); \
  }
