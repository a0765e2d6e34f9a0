// The main() of every wrapcert test binary. Bitwise comparisons (P4) need deterministic
// kernels: LibTorch's CPU reductions split work by thread count, which varies with load, so
// tests run LibTorch single-threaded.

#include <gmock/gmock.h>
#include <torch/utils.h>

int main(int argc, char** argv) {
  torch::set_num_threads(1);
  ::testing::InitGoogleMock(&argc, argv);
  return RUN_ALL_TESTS();
}
