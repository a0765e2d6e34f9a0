#pragma once
#include <string>

namespace wrapcert::bench {

std::string tools_dir();  ///< the source tree's tools/
std::string tool();       ///< the `wrapcert` executable ("" when the tool is not built)

}  // namespace wrapcert::bench
