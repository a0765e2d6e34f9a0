#pragma once
/// Wrapping recipes that real frameworks apply, as functions.
///
///   auto wrapped = wrapcert::fsdp_v2_recipe(model, {"GemmaDecoderLayer"});  // the seed's
///   auto a = wrapcert::compile(wrapcert::ddp(model));   // keys: _orig_mod.module....
///   auto b = wrapcert::ddp(wrapcert::compile(model));   // keys: module._orig_mod....
///
/// Each returns the new root; wrapping below the root rewires `model` in place.

#include <wrapcert/distributed.h>
#include <wrapcert/wrappers.h>

#include <string>
#include <vector>

namespace wrapcert {

struct FsdpV2RecipeOptions {
  /// torch_xla's `checkpoint_module` on every wrapped layer (`xla_fsdp_grad_ckpt`): patches the
  /// layer's forward in place, adding no module level.
  bool checkpoint_layers = true;
  SpmdFullyShardedDataParallelImpl::ShardOutput shard_output = nullptr;  ///< on the root only
};

/// The seed's: `SpmdFullyShardedDataParallel` around every module of the given classes (an
/// auto-wrap policy over `_no_split_modules`) and around the root.
ModulePtr fsdp_v2_recipe(const ModulePtr& model, const std::vector<std::string>& layer_classes,
                         const FsdpV2RecipeOptions& options = {});

/// torch FSDP's `transformer_auto_wrap_policy`: `FullyShardedDataParallel` around every module
/// of the given classes and around the root (deepest first, so with flat parameters each layer
/// flattens its own and the root the rest).
ModulePtr fsdp_v1_auto_wrap(const ModulePtr& model, const std::vector<std::string>& layer_classes,
                            FsdpOptions options = {});

/// `DistributedDataParallel` at the root (a world-size-1 group when none is given).
ModulePtr ddp(const ModulePtr& model, std::shared_ptr<ProcessGroup> group = nullptr);

/// `torch.compile(model)`: an `OptimizedModule` at the root.
ModulePtr compile(const ModulePtr& model);

/// `model.path = torch.compile(model.path)`: only a submodule compiled (accelerate #3683).
ModulePtr compile_submodule(const ModulePtr& model, const std::string& path);

}  // namespace wrapcert
