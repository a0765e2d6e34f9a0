#include <wrapcert/detail/marks.h>
#include <wrapcert/error.h>
#include <wrapcert/layer.h>
#include <wrapcert/state_dict.h>

namespace wrapcert {

StateDict state_dict(const ModulePtr& root) {
  return ModuleView::of(root).state_dict();
}

std::vector<std::string> keys(const StateDict& state) {
  return state.keys();
}

void load_state_dict(const ModulePtr& root, const StateDict& state) {
  const auto target = state_dict(root);
  for (const auto& item : state) {
    if (!target.contains(item.key())) {
      throw Error(ErrorCode::kUnknownKey, item.key(),
                  "unexpected key in the state dict (the model has no such key)");
    }
  }
  for (const auto& item : target) {
    const auto* source = state.find(item.key());
    if (!source) throw Error(ErrorCode::kUnknownKey, item.key(), "missing key in the state dict");
    if (source->sizes() != item.value().sizes() ||
        source->scalar_type() != item.value().scalar_type()) {
      throw Error(ErrorCode::kInvalidArgument, item.key(),
                  "shape or dtype mismatch: the state dict has " +
                      c10::str(source->sizes(), " ", source->scalar_type()) + ", the model " +
                      c10::str(item.value().sizes(), " ", item.value().scalar_type()));
    }
  }
  torch::NoGradGuard no_grad;
  for (const auto& item : target) item.value().copy_(state[item.key()]);
}

void mark_non_persistent(const ModulePtr& module, const std::string& buffer) {
  if (!module) throw Error(ErrorCode::kInvalidArgument, buffer, "null module");
  if (module->named_buffers(/*recurse=*/false).find(buffer) == nullptr) {
    throw Error(ErrorCode::kUnknownKey, buffer,
                python_type_name(*module) + " has no buffer named '" + buffer + "'");
  }
  detail::add_mark(module, detail::non_persistent_mark(buffer));
}

bool is_persistent(const torch::nn::Module& module, const std::string& buffer) {
  return !detail::has_mark(module, detail::non_persistent_mark(buffer));
}

}  // namespace wrapcert
