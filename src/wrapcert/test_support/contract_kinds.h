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

}  // namespace wrapcert::test_support
