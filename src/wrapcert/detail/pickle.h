#pragma once
/// The pickle machine behind `load_torch_save`, apart from the zip archive, so it can be tested
/// and fuzzed on its own.

#include <wrapcert/view.h>

#include <c10/core/Allocator.h>

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <utility>

namespace wrapcert::detail {

/// The archive's records by name ("data/0"): bytes and length, or nullopt when there is none.
using RecordSource =
    std::function<std::optional<std::pair<at::DataPtr, size_t>>(const std::string& name)>;

/// Runs the pickle `data[0, size)` of a `torch.save`d state dict. Throws `Error`
/// (kMalformedInput) naming `path`, and the key where there is one.
StateDict read_state_dict_pickle(const char* data, size_t size, const RecordSource& records,
                                 const std::string& path);

}  // namespace wrapcert::detail
