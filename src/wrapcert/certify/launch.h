#pragma once
/// Running a certification as ranks: one rank of a run (`run_rank`, started by `torchrun`, by
/// Slurm, by hand or by `launch_ranks`), and the local launcher behind
/// `wrapcert certify --world-size N` (`launch_ranks`).
///
///   // in each rank, RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set as torchrun sets them:
///   auto report = wrapcert::certify::run_rank(options, *wrapcert::Rendezvous::from_env());
///
/// The launcher serves the ranks' c10d `TCPStore` itself (as torchrun's agent does) and reads
/// there what rank 0 reports and where each rank is, so that a rank that crashes, exits or
/// hangs is a failed entry naming the rank and its last output, never a lost report.

#include <wrapcert/certify/certify.h>

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

namespace wrapcert {
struct Rendezvous;
}

namespace wrapcert::certify {

/// Joins the ranks of `rendezvous` and runs `run_ranks` there. The ranks agree on the seed (rank
/// 0 draws one when `options.seed` is 0) and fail, naming both values, when they were given
/// different ones. Rank 0 publishes each entry in the store for a launcher; `listener` is
/// called on every rank.
Report run_rank(Options options, const Rendezvous& rendezvous, const Listener& listener = nullptr);

struct World {
  int size = 2;
  /// One rank's command line (the program first). Each rank runs it with the variables
  /// torchrun sets (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`) and
  /// `WRAPCERT_STORE_SERVED=1` (the store is the launcher's).
  std::vector<std::string> command;
  /// The command that runs the whole run again, for the replay line of a failure.
  std::string replay;
  /// Seconds without progress on any rank (no collective entered, no entry reported) before
  /// the run is stopped as hung.
  int timeout_seconds = 120;
  /// What `command` runs, as a function (its exit code): where it is given and the launcher has
  /// no thread but its own when the ranks start, each rank is a fork of the launcher that runs
  /// it, with the same variables, output and files as an executed rank; the process start and
  /// LibTorch's operator registration (~0.6 s of CPU a rank) are not paid again. Else, and for
  /// the replay, `command` is executed.
  std::function<int()> here;
};

/// Starts `world.size` ranks, reports each entry rank 0 publishes to `listener`, and returns
/// them. A rank that exits before the end, is killed or hangs ends the run: the other ranks are
/// stopped (SIGTERM, then SIGKILL), every process is reaped, and the report gets a failed entry
/// naming the rank, how it ended and its last output. Nothing is left running or on disk.
Report launch_ranks(const Options& options, const World& world, const Listener& listener = nullptr);

/// The threads this process runs, from /proc (2 where it cannot tell). A fork copies only the
/// forking thread, and a lock another thread held stays held in the child: a process forks
/// instead of starting a program (the launcher's ranks, `wrapcert serve-forks`) only while this
/// is 1.
size_t threads_of_this_process();

}  // namespace wrapcert::certify
