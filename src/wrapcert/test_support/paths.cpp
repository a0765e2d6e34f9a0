#include <wrapcert/test_support/paths.h>

namespace wrapcert::test_support {

std::string golden_dir() {
  return WRAPCERT_GOLDEN_DIR;
}
std::string bridge_script() {
  return WRAPCERT_BRIDGE_SCRIPT;
}
std::string tree_dump_script() {
  return WRAPCERT_TREE_DUMP_SCRIPT;
}
std::string ddp_worker() {
  return WRAPCERT_DDP_WORKER;
}

}  // namespace wrapcert::test_support
