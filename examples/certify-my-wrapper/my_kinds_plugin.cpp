// The same kinds as a plugin, for the command line:
//   wrapcert certify --plugin build/libmy_kinds.so --wrappers Sharded
#include "my_wrapper.h"

#include <wrapcert/plugin.h>

WRAPCERT_PLUGIN(registry) {
  registry.add(my::sharded_kind());
  registry.add(my::leaky_sharded_kind());
}
