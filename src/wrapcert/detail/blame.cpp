#include <wrapcert/detail/blame.h>

namespace wrapcert::detail {
namespace {
thread_local std::string blamed;
}  // namespace

void note_blame(std::string who) {
  if (blamed.empty()) blamed = std::move(who);
}

std::string take_blame() {
  std::string out = std::move(blamed);
  blamed.clear();
  return out;
}

}  // namespace wrapcert::detail
