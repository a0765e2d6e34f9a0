// The main() of every wrapcert test binary. Bitwise comparisons (P4) need deterministic
// kernels: LibTorch's CPU reductions split work by thread count, which varies with load, so
// tests run LibTorch single-threaded.
//
// ctest runs a suite per process (cmake/WrapcertTestSuites.cmake) and reports it skipped when
// it prints the line below: every case skipped (no TPU, no GPU), none failed, none passed.

#include <ATen/Parallel.h>
#include <gmock/gmock.h>

#include <iostream>

namespace {

class EverySkippedLine : public ::testing::EmptyTestEventListener {
  void OnTestProgramEnd(const ::testing::UnitTest& run) override {
    if (run.skipped_test_count() > 0 && run.successful_test_count() == 0 &&
        run.failed_test_count() == 0) {
      std::cout << "wrapcert: every case skipped" << std::endl;
    }
  }
};

}  // namespace

int main(int argc, char** argv) {
  at::set_num_threads(1);
  ::testing::InitGoogleMock(&argc, argv);
  ::testing::UnitTest::GetInstance()->listeners().Append(new EverySkippedLine);
  return RUN_ALL_TESTS();
}
