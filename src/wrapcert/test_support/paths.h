#pragma once
/// Where the tests find files of the source and build trees. The paths are compiled into one
/// small file (paths.cpp) so that the test sources themselves do not depend on where the
/// checkout is, and compiler caches serve them to every clone.

#include <string>

namespace wrapcert::test_support {

std::string golden_dir();        ///< fixtures/golden
std::string bridge_script();     ///< tools/tpu_bridge/seed_unwrap.py
std::string tree_dump_script();  ///< tools/torch_tree_dump.py
std::string ddp_worker();        ///< the wrapcert_ddp_worker executable

}  // namespace wrapcert::test_support
