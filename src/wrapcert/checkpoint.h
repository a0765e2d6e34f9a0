#pragma once
/// Activation checkpointing: run a module without keeping its activations, and recompute them
/// in backward. Gradients equal an ordinary run's bit for bit (CPU, same kernels).
///
///   wrapcert::checkpoint_in_place(layer);        // torch_xla's checkpoint_module: no new level
///   auto y = wrapcert::call(*layer, x);           // now runs checkpointed
///   auto w = std::make_shared<wrapcert::CheckpointWrapperImpl>(layer);  // torch's wrapper

#include <wrapcert/registry.h>

namespace wrapcert {

/// Runs `module` on `input` under no-grad and returns an output whose backward re-runs the
/// module with grad enabled and differentiates it, for the input and every parameter of the
/// module. `module` must outlive the backward pass. Randomness in the module (dropout) is not
/// replayed: checkpoint only deterministic modules.
torch::Tensor checkpointed_call(torch::nn::Module& module, const torch::Tensor& input);

/// Marks `module` so that `wrapcert::call` runs it checkpointed: what torch_xla's
/// `checkpoint_module` does by patching `forward`, adding no module level and no key.
void checkpoint_in_place(const ModulePtr& module);
bool is_checkpointed(const torch::nn::Module& module);

}  // namespace wrapcert
