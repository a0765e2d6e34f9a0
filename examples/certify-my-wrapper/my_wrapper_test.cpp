// One line certifies a wrapper; a certification that fails is data to inspect.

#include "my_wrapper.h"

#include <wrapcert/certify/certify_gtest.h>
#include <wrapcert/fixtures/certification.h>

#include <iostream>

namespace {

wrapcert::certify::Options options() {
  wrapcert::certify::Options o;
  o.cases = 50;
  o.seed = 2026;
  o.models = wrapcert::fixtures::certification_models();  // gemma, Mistral: layouts and numerics
  return o;
}

WRAPCERT_CERTIFY_TEST(Sharded, IsCertified, my::sharded_kind(), options());

TEST(LeakySharded, IsRejectedWithAReadableCounterexample) {
  const auto report = wrapcert::certify::run(my::leaky_sharded_kind(), options());
  std::cout << wrapcert::certify::to_summary(report);
  ASSERT_FALSE(report.passed());
  for (const auto& e : report.entries) {
    if (e.status != wrapcert::certify::Status::kFailed || e.counterexample.empty()) continue;
    std::cout << "\n"
              << e.property << ": " << e.reason << " at '" << e.key << "'\n"
              << e.counterexample << "\n";
    EXPECT_NE(e.counterexample.find("LeakySharded("), std::string::npos);
    return;
  }
  FAIL() << "no failure came with a counterexample";
}

}  // namespace
