#pragma once
/// Large trees for the adversarial tests and the benchmarks, built the same way in both.
///
///   auto tree = wrapcert::test_support::wide_tree(1000, 998);  // 1,000,001 modules

#include <wrapcert/registry.h>

#include <cstddef>

namespace wrapcert::test_support {

/// A root with `blocks` blocks of `width` leaves, each leaf one parameter `w` on the meta device
/// and each block wrapped in a DataParallel: blocks * (width + 2) + 1 modules.
ModulePtr wide_tree(size_t blocks, size_t width);

}  // namespace wrapcert::test_support
