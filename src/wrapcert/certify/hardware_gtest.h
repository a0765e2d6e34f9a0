#pragma once
/// Skip a googletest test, with the reason, when the device it needs is absent.
///
///   TEST(Cuda, UnwrapsOnTheGpu) {
///     WRAPCERT_REQUIRE_CUDA();
///     ...
///   }

#include <wrapcert/certify/hardware.h>

#include <gtest/gtest.h>

namespace wrapcert::hardware {
/// Detected once per process.
inline const Report& this_host() {
  static const Report report = detect();
  return report;
}
}  // namespace wrapcert::hardware

#define WRAPCERT_REQUIRE_CUDA()                                                   \
  do {                                                                            \
    const auto& wrapcert_hw_ = ::wrapcert::hardware::this_host();                 \
    if (wrapcert_hw_.cuda_devices == 0) GTEST_SKIP() << wrapcert_hw_.cuda_reason; \
  } while (0)

#define WRAPCERT_REQUIRE_TPU()                                      \
  do {                                                              \
    const auto& wrapcert_hw_ = ::wrapcert::hardware::this_host();   \
    if (!wrapcert_hw_.tpu) GTEST_SKIP() << wrapcert_hw_.tpu_reason; \
  } while (0)
