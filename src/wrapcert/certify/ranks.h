#pragma once
/// Certification across the ranks of a process group: the kinds that declare
/// `ranks.certify` (DDP, FSDP's sharded and mixed-precision modes, SPMD FSDP sharded) wrap
/// generated trees on every rank, over `torch.distributed`'s own Gloo group, and P1, P4, P10, P13
/// and P14 are judged across ranks (docs/SEMANTICS.md §5).
///
///   auto group = wrapcert::ProcessGroup::join(*wrapcert::Rendezvous::from_env());
///   auto report = wrapcert::certify::run_ranks(options, group);  // on every rank
///   if (group->rank() == 0) std::cout << wrapcert::certify::to_summary(report);
///
/// Every rank runs the same seeded cases and returns the same report: each case's verdict is
/// agreed among the ranks (the first rank that failed, named), so rapidcheck shrinks in step on
/// every rank.

#include <wrapcert/certify/certify.h>

#include <memory>

namespace wrapcert {
class ProcessGroup;
}

namespace wrapcert::certify {

/// The properties across ranks, in order: "P1 keys across ranks", "P13 values across ranks",
/// "P10 round trip across ranks", "P4 backward across ranks", "P14 release across ranks".
const std::vector<std::string>& rank_properties();

/// Certifies `options.kinds` (empty: `Registry::names_across_ranks()`) across the ranks of
/// `group`, which becomes the default group for the run. Every rank calls it with the same
/// options; `options.seed` must not be 0 (the ranks must draw the same trees). `isolate` and
/// `models` do not apply. Throws `Error` for a kind that does not declare `ranks.certify`.
Report run_ranks(const Options& options, const std::shared_ptr<ProcessGroup>& group,
                 const Listener& listener = nullptr);

}  // namespace wrapcert::certify
