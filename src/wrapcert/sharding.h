#pragma once
/// Sharding across the ranks of a `ProcessGroup`, as FSDP shards its flat parameter and XLA's
/// SPMD shards a tensor along its first dimension over a one-dimensional mesh: each rank holds
/// `ceil(rows / world size)` rows, the last ranks padded with zeros. Public, so that a kind of
/// your own shards the same way the built-in ones do.
///
///   const auto shard = wrapcert::RowShard::of(weight.size(0), group->rank(), group->size());
///   auto local = wrapcert::take_rows(weight, shard);            // this rank's rows, padded
///   auto whole = wrapcert::gather_rows(local, shard, group);     // all-gathered; backward
///                                                                // reduce-scatters the gradient
///
/// A wrapper that shards implements `ShardedModule`: its sharded state dict (this rank's
/// pieces, with their offsets) and its full state dict gathered to one rank. Certification
/// across ranks checks that the shards tile every tensor and translate to the model's keys.

#include <wrapcert/registry.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace wrapcert {

class ProcessGroup;

/// Which rows of a tensor one rank holds.
struct RowShard {
  int64_t rows = 0;   ///< the whole tensor's first dimension
  int64_t chunk = 0;  ///< rows every rank holds, padding included: `ceil(rows / size)`
  int rank = 0;
  int size = 1;

  static RowShard of(int64_t rows, int rank, int size);
  /// The first real row this rank holds (clamped to `rows`).
  int64_t begin() const;
  /// One past the last real row this rank holds.
  int64_t end() const;
};

/// This rank's rows of `full`, padded with zeros to `chunk` rows: a fresh tensor, not tracked by
/// autograd.
torch::Tensor take_rows(const torch::Tensor& full, const RowShard& shard);

struct GatherOptions {
  GradientReduction reduction = GradientReduction::kMean;
  /// The dtype gradients are reduced in; unset: the gradient's own.
  std::optional<c10::ScalarType> reduce_dtype;
};

/// The whole tensor (`shard.rows` rows) from every rank's `local` rows: all-gathered, padding cut
/// off. Differentiable: the gradient is reduce-scattered back to `local`, summed over the ranks
/// and, for `kMean`, divided by the world size. Every rank must call it, in the same order.
torch::Tensor gather_rows(const torch::Tensor& local, const RowShard& shard,
                          const std::shared_ptr<ProcessGroup>& group, GatherOptions options = {});

/// The whole tensor, gathered without autograd.
torch::Tensor gather_rows_detached(const torch::Tensor& local, const RowShard& shard,
                                   ProcessGroup& group);

/// One entry of a sharded state dict: the part of one tensor this rank holds.
struct LocalShard {
  std::string key;             ///< relative to the wrapper that holds it (`_orig_module.fc.weight`)
  torch::Tensor values;        ///< this rank's elements of the flattened tensor
  torch::Tensor grad;          ///< their gradient; undefined when none reached them
  int64_t offset = 0;          ///< where `values` start in the flattened tensor
  std::vector<int64_t> shape;  ///< the whole tensor's
};

/// A wrapper whose state is sharded across ranks.
class ShardedModule {
 public:
  virtual ~ShardedModule() = default;
  /// This rank's part of every tensor it shards (torch's `SHARDED_STATE_DICT`); the tensors it
  /// holds whole (nothing sharded) are left to the module's own state dict.
  virtual std::vector<LocalShard> local_shards() const = 0;
  /// Every tensor it shards, whole, on rank `root`; empty on the other ranks (torch's
  /// `FULL_STATE_DICT` with `rank0_only`). A collective: every rank calls it.
  virtual std::vector<std::pair<std::string, torch::Tensor>> full_state_dict(int root) = 0;
};

/// The parameters of a subtree sharded one by one along their first dimension (XLA's SPMD
/// sharding over a one-dimensional mesh): each module's parameter is replaced in its registry,
/// in its place, by this rank's rows (a parameter of its own, what an optimizer steps); a forward
/// under `unshard()` runs on the gathered whole tensors; `restore` gives every module back the
/// very tensor it had, holding the gathered current values.
class ShardedParameters {
 public:
  struct Piece {
    std::shared_ptr<torch::nn::Module> owner;
    std::string name;
    torch::Tensor original;
    torch::Tensor local;  ///< shared by the pieces of a tied tensor
    RowShard shard;
  };

  ShardedParameters() = default;
  ShardedParameters(const ShardedParameters&) = delete;
  ShardedParameters& operator=(const ShardedParameters&) = delete;
  ~ShardedParameters();

  /// Shards the parameters of `inner`'s subtree over `group` (each tensor once, a tied one
  /// shared), not entering modules for which `skip` is true and leaving out tensors another
  /// `ShardedParameters` holds. Scalars (no first dimension) stay whole.
  void take(const std::shared_ptr<torch::nn::Module>& inner, std::shared_ptr<ProcessGroup> group,
            GatherOptions options = {},
            const std::function<bool(const torch::nn::Module&)>& skip = nullptr);
  const std::vector<Piece>& pieces() const { return pieces_; }
  bool holding() const { return group_ != nullptr; }

  /// While alive, the gathered whole tensors (cast to `compute_dtype` when given) stand where
  /// the shards are registered; the shards are back when it ends, also on an exception.
  class Unsharded {
   public:
    explicit Unsharded(const std::vector<Piece>* pieces) : pieces_(pieces) {}
    Unsharded(Unsharded&& other) noexcept : pieces_(other.pieces_) { other.pieces_ = nullptr; }
    Unsharded(const Unsharded&) = delete;
    Unsharded& operator=(const Unsharded&) = delete;
    Unsharded& operator=(Unsharded&&) = delete;
    ~Unsharded();

   private:
    const std::vector<Piece>* pieces_;
  };
  [[nodiscard]] Unsharded unshard(std::optional<c10::ScalarType> compute_dtype = std::nullopt);

  /// `LocalShard`s keyed relative to `holder` (a module above every owner).
  std::vector<LocalShard> local_shards(const torch::nn::Module& holder) const;
  /// The whole tensors on `root` (a collective), keyed relative to `holder`.
  std::vector<std::pair<std::string, torch::Tensor>> full_state_dict(
      const torch::nn::Module& holder, int root);
  /// Gathers the current values into the originals and registers them again. A collective;
  /// a no-op when not holding.
  void restore();

 private:
  void forget();
  std::shared_ptr<ProcessGroup> group_;
  GatherOptions options_;
  std::vector<Piece> pieces_;
};

/// For its lifetime, the floating-point buffers of `root`'s subtree hold a cast to `dtype` (the
/// originals put back when it ends, also on an exception), not entering modules for which `skip`
/// is true: FSDP's `MixedPrecision(buffer_dtype=...)` for one forward.
class ScopedBufferCast {
 public:
  ScopedBufferCast(const torch::nn::Module& root, c10::ScalarType dtype,
                   const std::function<bool(const torch::nn::Module&)>& skip = nullptr);
  ~ScopedBufferCast();
  ScopedBufferCast(const ScopedBufferCast&) = delete;
  ScopedBufferCast& operator=(const ScopedBufferCast&) = delete;

 private:
  struct Saved {
    const torch::nn::Module* module;
    std::string name;
    torch::Tensor original;
  };
  std::vector<Saved> saved_;
};

/// The path of every module below `holder` (the first path of a shared one), for keys relative
/// to a wrapper.
std::vector<std::pair<const torch::nn::Module*, std::string>> module_paths(
    const torch::nn::Module& holder);

}  // namespace wrapcert
