#pragma once
/// What a wrapper holds besides its slot that its kind does not name in `owned_state`: the
/// reference view refuses to see through such a wrapper, and P15 reports it.

#include <wrapcert/detail/parameter_table.h>
#include <wrapcert/registry.h>

#include <optional>
#include <string>

namespace wrapcert::detail {

struct StrayState {
  std::string name;  ///< the parameter, buffer or child outside the slot
  std::string what;  ///< "parameter", "buffer" or "child"
};

/// The first such item (parameters, then buffers, then children), or none. Reads the tables in
/// place: the reference view asks this of every wrapper it sees through.
inline std::optional<StrayState> stray_state(const torch::nn::Module& wrapper,
                                             const WrapperKind& kind) {
  for (const auto& item : parameter_table(wrapper)) {
    if (item.value().defined() && !kind.owns(item.key())) {
      return StrayState{item.key(), "parameter"};
    }
  }
  for (const auto& item : buffer_table(wrapper)) {
    if (item.value().defined() && !kind.owns(item.key())) return StrayState{item.key(), "buffer"};
  }
  for (const auto& item : child_table(wrapper)) {
    if (item.key() != kind.slot && !kind.owns(item.key())) return StrayState{item.key(), "child"};
  }
  return std::nullopt;
}

}  // namespace wrapcert::detail
