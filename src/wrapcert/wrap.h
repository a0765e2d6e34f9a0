#pragma once
/// Putting wrappers into a model: at a path, or by module type like an auto-wrap policy.
///
///   model = wrapcert::wrap(model, "model.embed_tokens", "SpmdFullyShardedDataParallel");
///   model = wrapcert::auto_wrap(model, {"GemmaDecoderLayer"}, "SpmdFullyShardedDataParallel");
///   model = wrapcert::wrap(model, "", "SpmdFullyShardedDataParallel");  // the root
///
/// The wrapper goes onto the forward path: the parent's registry entry is replaced, and so is
/// the second copy that LibTorch's `Sequential`, `ModuleList` and `ModuleDict` keep. A custom
/// parent must call its children by name (`wrapcert::Layer::call_child`) for a wrapper to run.

#include <wrapcert/registry.h>

#include <string>
#include <string_view>
#include <vector>

namespace wrapcert {

/// The module at dotted `path` under `root` ("" is `root`); throws `Error` (kUnknownPath)
/// naming the first component that does not exist.
ModulePtr module_at(const ModulePtr& root, std::string_view path);

/// Replaces child `name` of `parent` everywhere `parent` keeps it: the registry and, for
/// LibTorch's containers, their own list. Throws `Error` (kUnknownPath) if there is no such
/// child, and (kInvalidArgument) for a `Sequential` element that is not a single-tensor module.
void replace_child(torch::nn::Module& parent, const std::string& name, ModulePtr child);

/// Puts `module` at dotted `path` under `root` (with `replace_child`) and returns the root:
/// `module` itself when `path` is "". Throws as `module_at` and `replace_child` do.
ModulePtr replace_at(const ModulePtr& root, std::string_view path, ModulePtr module);

/// Wraps the module at `path` in a new wrapper of `kind` and returns the (possibly new) root.
ModulePtr wrap(const ModulePtr& root, std::string_view path, const WrapperKind& kind);
ModulePtr wrap(const ModulePtr& root, std::string_view path, std::string_view kind_name,
               const Registry& registry = Registry::global());

struct AutoWrapOptions {
  /// Also wrap the root, as FSDP does after applying its auto-wrap policy.
  bool wrap_root = true;
};

/// Wraps every module whose PyTorch class name is in `type_names` (like `_no_split_modules`
/// and `transformer_auto_wrap_policy`), each edge to it separately, and returns the new root.
/// Throws `Error` (kInvalidArgument) when no module matches a given name.
ModulePtr auto_wrap(const ModulePtr& root, const std::vector<std::string>& type_names,
                    const WrapperKind& kind, AutoWrapOptions options = {});
ModulePtr auto_wrap(const ModulePtr& root, const std::vector<std::string>& type_names,
                    std::string_view kind_name, AutoWrapOptions options = {},
                    const Registry& registry = Registry::global());

}  // namespace wrapcert
