// Where the benchmarks find the sources' tools and the command-line tool: compiled into this one
// small file so that unwrap_bench.cpp does not depend on the checkout's path (ccache serves it to
// every clone).
#include "bench_paths.h"

namespace wrapcert::bench {

std::string tools_dir() {
  return WRAPCERT_TOOLS_DIR;
}
std::string tool() {
  return WRAPCERT_TOOL;
}

}  // namespace wrapcert::bench
