#pragma once
/// Ranks on torch.distributed's own engine: c10d's `TCPStore` rendezvous (as `torchrun` and
/// `init_process_group("gloo", "env://")` do it), `ProcessGroupGloo`, and the collectives the
/// sharding wrappers use.
///
///   auto rdzv = wrapcert::Rendezvous::from_env();          // RANK, WORLD_SIZE, MASTER_ADDR, ...
///   auto group = wrapcert::ProcessGroup::join(*rdzv);
///   wrapcert::ProcessGroup::set_default(group);            // what the wrappers shard over

#include <torch/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace wrapcert {

/// Where the ranks of a run meet: c10d's `TCPStore` at `master_addr:master_port`, served by
/// rank 0 (as `torchrun` and Slurm runs expect) unless another process serves it
/// (`store_served`: the launcher of `wrapcert certify --world-size N`).
struct Rendezvous {
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  bool store_served = false;
  /// Keys live under this prefix in the store (torchrun's agent store: `/worker/attempt_N`).
  std::string store_prefix;
  /// How long joining, and then every collective, may wait for the other ranks.
  std::chrono::milliseconds timeout{std::chrono::seconds(120)};

  /// From the variables `torchrun` sets (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`,
  /// `MASTER_PORT`), else Slurm's (`SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`, with
  /// `MASTER_ADDR`/`MASTER_PORT`); nullopt when neither names a rank and a world size. Under
  /// torchrun's agent (`TORCHELASTIC_USE_AGENT_STORE=True`) the agent serves the store and keys
  /// live under `/worker/attempt_<TORCHELASTIC_RESTART_COUNT>`, as `init_process_group` does it;
  /// `WRAPCERT_STORE_SERVED=1`: wrapcert's launcher serves it. Throws
  /// `Error` (kInvalidArgument, naming the variable) for a value that is not a number or a
  /// rank outside the world.
  static std::optional<Rendezvous> from_env();
  /// Throws `Error` (kInvalidArgument) for a rank outside the world or a port outside 1-65535.
  void validate() const;
};

/// The c10d store a launcher serves for its ranks (`TCPStore` as server), so that it can read
/// where each rank is while they run. Binds `port` (0: a free one).
class StoreServer {
 public:
  explicit StoreServer(int port = 0);
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;
  int port() const;
  /// The value of `key`, or nullopt when no rank has set it.
  std::optional<std::string> get(const std::string& key) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// A c10d process group, opaque here so that this header does not pull in c10d and Gloo.
class ProcessGroup {
 public:
  /// Gloo over a `c10d::FileStore` at `store_path` (all ranks use the same path), bound to the
  /// loopback interface. Blocks until all `world_size` ranks have joined.
  static std::shared_ptr<ProcessGroup> gloo(const std::string& store_path, int rank,
                                            int world_size);
  /// A world-size-1 Gloo group of this process, created on first use.
  static std::shared_ptr<ProcessGroup> single_process();
  /// Joins the ranks of `rendezvous` (blocking until all have joined, within its timeout).
  /// Throws `Error` (kInvalidArgument) naming the address when the store cannot be served or
  /// reached, or the ranks do not agree on the world size.
  static std::shared_ptr<ProcessGroup> join(const Rendezvous& rendezvous);
  /// The group wrappers use when given none (torch's default group, `init_process_group`).
  static void set_default(std::shared_ptr<ProcessGroup> group);
  /// The default group, else `single_process()`.
  static std::shared_ptr<ProcessGroup> current();

  int rank() const;
  int size() const;
  /// Sums `tensor` over all ranks, in place (blocking).
  void all_reduce_sum(torch::Tensor& tensor);
  /// Every rank's `tensor` (the same shape and dtype on every rank), in rank order.
  std::vector<torch::Tensor> all_gather(const torch::Tensor& tensor);
  /// The sum over ranks of `tensor` (the same shape on every rank, its first dimension a
  /// multiple of the world size), this rank's `1/size` of its rows. Gloo in LibTorch 1.13 has no
  /// reduce-scatter: an all-reduce, then this rank's rows.
  torch::Tensor reduce_scatter_sum(const torch::Tensor& tensor);
  /// Every rank's `text`, in rank order.
  std::vector<std::string> all_gather_text(const std::string& text);
  /// The largest of every rank's `value`.
  std::int64_t all_reduce_max(std::int64_t value);
  /// Collectives this rank has entered so far.
  std::int64_t collectives() const;
  /// Records in the store where this rank is (`what`; each collective it enters records its
  /// count too), for a launcher to name a rank that hangs: the others wait in a collective it
  /// never entered. A no-op for a group without a TCP store.
  void mark(const std::string& what);
  /// Sets `key` in the group's TCP store (what a launcher reads); a no-op without one.
  void publish(const std::string& key, const std::string& value);

  struct Impl;
  explicit ProcessGroup(std::unique_ptr<Impl> impl);
  ~ProcessGroup();

 private:
  /// Counts a collective, and writes what it is to the launcher's file where there is one.
  void entered_collective(const char* op, const torch::Tensor& tensor);
  std::unique_ptr<Impl> impl_;
};

}  // namespace wrapcert
