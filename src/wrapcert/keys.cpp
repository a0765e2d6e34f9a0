#include <wrapcert/detail/path.h>
#include <wrapcert/error.h>
#include <wrapcert/keys.h>
#include <wrapcert/unwrap.h>

namespace wrapcert {

KeyTranslator KeyTranslator::from_tree(const ModulePtr& wrapped, const Registry& registry) {
  KeyTranslator tr;
  unwrap_reference(wrapped, registry)
      .for_each_state([&tr](const std::string& clean, const std::string& wrapped_key,
                            const torch::Tensor&) { tr.pairs_.emplace_back(wrapped_key, clean); });
  // What the wrappers hold of their own (a flat parameter): keys of the tree that are no model
  // key, so that asking to translate one says what it is.
  ModuleView::of(wrapped).for_each_state(
      [&tr](const std::string& key, const std::string&, const torch::Tensor&) {
        tr.wrapper_state_.insert(key);
      });
  // The views point into `pairs_`, which no longer grows.
  tr.by_wrapped_.reserve(tr.pairs_.size());
  tr.by_clean_.reserve(tr.pairs_.size());
  for (size_t i = 0; i < tr.pairs_.size(); ++i) {
    const auto& [w, c] = tr.pairs_[i];
    if (!tr.by_wrapped_.emplace(w, i).second) {
      throw Error(ErrorCode::kKeyCollision, w, "the wrapped tree has this key twice");
    }
    if (auto [it, fresh] = tr.by_clean_.emplace(c, i); !fresh) {
      throw Error(
          ErrorCode::kKeyCollision, c,
          "both '" + tr.pairs_[it->second].first + "' and '" + w + "' translate to this key");
    }
  }
  for (const auto& [w, c] : tr.pairs_) tr.wrapper_state_.erase(w);
  return tr;
}

const std::string& KeyTranslator::to_clean(std::string_view wrapped_key) const {
  auto it = by_wrapped_.find(wrapped_key);
  if (it == by_wrapped_.end()) {
    if (wrapper_state_.count(std::string(wrapped_key))) {
      throw Error(ErrorCode::kUnknownKey, std::string(wrapped_key),
                  "a wrapper's own state (declared in its kind's owned_state), not the model's: "
                  "it has no clean key; leave it out, or save it beside the model");
    }
    throw Error(ErrorCode::kUnknownKey, std::string(wrapped_key),
                "the wrapped model has no such state-dict key");
  }
  return pairs_[it->second].second;
}

const std::string& KeyTranslator::to_wrapped(std::string_view clean_key) const {
  auto it = by_clean_.find(clean_key);
  if (it == by_clean_.end()) {
    throw Error(ErrorCode::kUnknownKey, std::string(clean_key),
                "the unwrapped model has no such state-dict key");
  }
  return pairs_[it->second].first;
}

StateDict KeyTranslator::to_clean(const StateDict& state) const {
  StateDict out;
  out.reserve(state.size());
  for (const auto& item : state) out.insert(to_clean(item.key()), item.value());
  return out;
}

StateDict KeyTranslator::to_wrapped(const StateDict& state) const {
  StateDict out;
  out.reserve(state.size());
  for (const auto& item : state) out.insert(to_wrapped(item.key()), item.value());
  return out;
}

bool removes_whole_components(std::string_view wrapped, std::string_view clean) {
  detail::PathComponents have(wrapped), want(clean);
  std::string_view w, c;
  while (want.next(c)) {
    bool found = false;
    while (!found && have.next(w)) found = w == c;
    if (!found) return false;
  }
  return true;
}

}  // namespace wrapcert
