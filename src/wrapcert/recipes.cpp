#include <wrapcert/layer.h>
#include <wrapcert/recipes.h>
#include <wrapcert/wrap.h>

namespace wrapcert {

ModulePtr fsdp_v2_recipe(const ModulePtr& model, const std::vector<std::string>& layer_classes,
                         const FsdpV2RecipeOptions& options) {
  WrapperKind per_layer = Registry::global().at("SpmdFullyShardedDataParallel");
  const bool checkpoint = options.checkpoint_layers;
  per_layer.make = [checkpoint](ModulePtr inner) -> ModulePtr {
    if (checkpoint) checkpoint_in_place(inner);  // torch_xla's checkpoint_module
    return std::make_shared<SpmdFullyShardedDataParallelImpl>(std::move(inner));
  };
  AutoWrapOptions layers_only;
  layers_only.wrap_root = false;
  auto wrapped = auto_wrap(model, layer_classes, per_layer, layers_only);
  return std::make_shared<SpmdFullyShardedDataParallelImpl>(wrapped, options.shard_output);
}

ModulePtr fsdp_v1_auto_wrap(const ModulePtr& model, const std::vector<std::string>& layer_classes,
                            FsdpOptions options) {
  WrapperKind kind = Registry::global().at("FullyShardedDataParallel");
  kind.make = [options](ModulePtr inner) -> ModulePtr {
    return std::make_shared<FullyShardedDataParallelImpl>(std::move(inner), options);
  };
  return auto_wrap(model, layer_classes, kind);
}

ModulePtr ddp(const ModulePtr& model, std::shared_ptr<ProcessGroup> group) {
  return std::make_shared<DistributedDataParallelImpl>(model, std::move(group));
}

ModulePtr compile(const ModulePtr& model) {
  return wrap(model, "", "OptimizedModule");
}

ModulePtr compile_submodule(const ModulePtr& model, const std::string& path) {
  return wrap(model, path, "OptimizedModule");
}

}  // namespace wrapcert
