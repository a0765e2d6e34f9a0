#pragma once
/// Wrapper kinds that declare contracts, for wrapcert's own tests: correct ones that
/// certification must accept, and one faulty kind per contract that the property named for it
/// must reject.
///
///   auto kind = wrapcert::test_support::copying_release_kind();  // P14 rejects it

#include <wrapcert/registry.h>

namespace wrapcert::test_support {

// Correct: each certifies with every property.
/// Keeps a step counter of its own (`_step`, declared in `owned_state`).
WrapperKind step_counter_kind();
/// Declares `module` as an alias of its slot, reached through its default (the slot).
WrapperKind aliased_relay_kind();
/// Holds its subtree's parameters flat (`FlatParameters`), gives them back on release.
WrapperKind flat_shard_kind();
/// A pass-through with a mode, `ModalRelay[fused]`, also a pass-through.
WrapperKind modal_relay_kind();
/// Keeps a non-persistent statistic (a tensor it does not register), in its mode too.
WrapperKind input_stats_kind();
/// Forwards `train()`/`eval()` to the module it wraps by a `train` of its own.
WrapperKind forwarding_train_kind();
/// Takes a path of its own under `torch.no_grad()`, computing the same.
WrapperKind exact_no_grad_kind();

// Faulty: each breaks one contract.
/// P14: its release gives the inner modules copies of their parameters.
WrapperKind copying_release_kind();
/// P14: its release takes the inner module out of its slot.
WrapperKind emptying_release_kind();
/// P14: a flat kind whose release puts two parameters of one shape back swapped.
WrapperKind swapped_flat_release_kind();
/// P15: registers the inner module a second time (`_shadow`) and declares it as owned state.
WrapperKind second_registration_kind();
/// P16: declares the alias `module`, which reaches its own `_stats` child, not its slot.
WrapperKind misdirected_alias_kind();

// Faulty where only running the model shows it (P4), and one whose state collides (P15).
/// P4: a flat kind whose forward puts two parameters of one shape in each other's place.
WrapperKind swapped_flat_forward_kind();
/// P4: a flat kind whose forward runs on detached views: no gradient reaches the flat parameter.
WrapperKind detached_flat_views_kind();
/// P4 in float32 alone: rounds a float32 input through bfloat16.
WrapperKind float32_rounding_kind();
/// P4 in eval mode alone: runs the inner module without autograd there.
WrapperKind eval_no_grad_kind();
/// P4 on `ModalFault[fused]` alone: the mode scales outputs by 1 + 2^-6.
WrapperKind modal_fault_kind();
/// P15: holds a `weight` of its own, what its inner module's `weight` translates to.
WrapperKind colliding_state_kind();
/// P2: sets `requires_grad` on every parameter it wraps (frozen ones too).
WrapperKind unfreezing_kind();
/// P17: its `eval()` leaves the module it wraps in training mode.
WrapperKind stuck_in_training_kind();
/// P2: keeps a clone of a module LibTorch can clone (`torch::nn::Linear`) instead of the module.
WrapperKind clone_keeping_kind();
/// P4: doubles its output for batches of three or more.
WrapperKind large_batch_fault_kind();
/// P17: doubles its output under `torch.no_grad()`.
WrapperKind no_grad_scale_kind();
/// P17: a flat kind whose forward runs on the values gathered when it was made, not the
/// parameters the optimizer stepped since (gradients still reach its flat parameter).
WrapperKind stale_gather_kind();
/// P17: leaves its own parameter a gradient of another shape, so that an optimizer step raises.
WrapperKind optimizer_breaking_kind();
/// P4: returns its first output on every call. Inside a `CheckpointWrapper` its cached output
/// once made the recomputation wait on itself.
WrapperKind cached_output_kind();

}  // namespace wrapcert::test_support
