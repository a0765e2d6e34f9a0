// The built-in wrapper kinds (the zoo), in the order `Registry::with_builtins()` lists them, and
// the process-wide registry that starts with them. Here, above the wrappers and the distributed
// wrapper, so that the registry itself knows no wrapper.
#include <wrapcert/distributed.h>
#include <wrapcert/registry.h>
#include <wrapcert/wrappers.h>

namespace wrapcert {

namespace {
template <typename Tag>
WrapperKind pass_through_kind() {
  return wrapper_kind<detail::PassThroughWrapperImpl<Tag>>(Tag::kName, Tag::kSlot);
}
}  // namespace

Registry& Registry::global() {
  static Registry registry = with_builtins();
  return registry;
}

Registry Registry::with_builtins() {
  Registry registry;
  registry.add(pass_through_kind<detail::DataParallelTag>());
  registry.add(distributed_data_parallel_kind());
  auto fsdp = wrapper_kind<FullyShardedDataParallelImpl>("FullyShardedDataParallel",
                                                         "_fsdp_wrapped_module");
  fsdp.aliases = {"module"};           // FullyShardedDataParallel.module property
  fsdp.forwards_attributes = true;     // and __getattr__ falls through to the wrapped module
  fsdp.owned_state = {"_flat_param"};  // in flat mode
  fsdp.release = [](torch::nn::Module& wrapper) {
    return dynamic_cast<FullyShardedDataParallelImpl&>(wrapper).release();
  };
  // `use_orig_params=False`: one flat parameter per wrapper, the originals back on release.
  FsdpOptions flat;
  flat.flat_parameters = true;
  fsdp.modes.push_back(WrapperMode{"flat",
                                   [flat](ModulePtr inner) -> ModulePtr {
                                     return std::make_shared<FullyShardedDataParallelImpl>(
                                         std::move(inner), flat);
                                   },
                                   Numerics::kNeedsRelease});
  // Across ranks (certified at world sizes above one, where they differ from "flat"): the flat
  // parameter sharded (`FULL_SHARD`), and sharded with bfloat16 compute and float32 reduction.
  AcrossRanks across;
  across.certify = true;
  FsdpOptions sharded = flat;
  sharded.sharded = true;
  WrapperMode sharded_mode{"sharded",
                           [sharded](ModulePtr inner) -> ModulePtr {
                             return std::make_shared<FullyShardedDataParallelImpl>(std::move(inner),
                                                                                   sharded);
                           },
                           Numerics::kNeedsRelease};
  sharded_mode.ranks = across;
  sharded_mode.ranks_only = true;
  fsdp.modes.push_back(sharded_mode);
  FsdpOptions mixed = sharded;
  mixed.compute_dtype = torch::kBFloat16;
  AcrossRanks across_mixed = across;
  across_mixed.compute_dtype = torch::kBFloat16;
  WrapperMode mixed_mode{"mixed",
                         [mixed](ModulePtr inner) -> ModulePtr {
                           return std::make_shared<FullyShardedDataParallelImpl>(std::move(inner),
                                                                                 mixed);
                         },
                         Numerics::kNeedsRelease};
  mixed_mode.ranks = across_mixed;
  mixed_mode.ranks_only = true;
  fsdp.modes.push_back(mixed_mode);
  registry.add(std::move(fsdp));
  auto fsdp_v2 = wrapper_kind<SpmdFullyShardedDataParallelImpl>("SpmdFullyShardedDataParallel",
                                                                "_orig_module");
  fsdp_v2.aliases = {"module"};  // torch_xla: `module` is a property aliasing `_orig_module`
  fsdp_v2.forwards_attributes = true;
  fsdp_v2.release = [](torch::nn::Module& wrapper) {
    return dynamic_cast<SpmdFullyShardedDataParallelImpl&>(wrapper).release();
  };
  // Across ranks: every parameter sharded along its first dimension over a one-dimensional mesh.
  WrapperMode spmd_sharded{"sharded", [](ModulePtr inner) -> ModulePtr {
                             SpmdOptions options;
                             options.sharded = true;
                             return std::make_shared<SpmdFullyShardedDataParallelImpl>(
                                 std::move(inner), options);
                           }};
  spmd_sharded.ranks = across;
  spmd_sharded.ranks_only = true;
  fsdp_v2.modes.push_back(spmd_sharded);
  registry.add(std::move(fsdp_v2));
  auto compiled = pass_through_kind<detail::OptimizedModuleTag>();
  compiled.forwards_attributes = true;  // OptimizedModule.__getattr__ falls through to _orig_mod
  registry.add(std::move(compiled));
  auto checkpoint =
      wrapper_kind<CheckpointWrapperImpl>("CheckpointWrapper", "_checkpoint_wrapped_module");
  checkpoint.forwards_attributes = true;    // ActivationWrapper.__getattr__ does the same
  checkpoint.state_dict_hides_slot = true;  // its _post_state_dict_hook strips the prefix
  // Recomputation sums an input's gradient contributions in another order when the input is
  // also used outside the checkpointed module (a + (b + c) for (a + b) + c).
  checkpoint.numerics = Numerics::kTolerance;
  checkpoint.tolerance = 64;  // machine epsilons of the dtype compared
  registry.add(std::move(checkpoint));
  auto deepspeed = pass_through_kind<detail::DeepSpeedEngineTag>();
  deepspeed.forwards_attributes = true;  // DeepSpeedEngine.__getattr__ looks in self.module
  registry.add(std::move(deepspeed));
  auto fp32 = wrapper_kind<Fp32OutputWrapperImpl>("Fp32OutputWrapper", "module");
  fp32.numerics = Numerics::kChangesOutput;
  registry.add(std::move(fp32));
  return registry;
}

}  // namespace wrapcert
