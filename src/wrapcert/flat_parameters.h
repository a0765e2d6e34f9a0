#pragma once
/// Parameters of a subtree held in one flat tensor, the way FSDP's `use_orig_params=False`
/// holds them: the modules' own parameters leave their registries (the wrapper's keys show the
/// flat tensor instead), a forward runs them on views of it, and `restore` gives every module
/// back the very tensors it had, holding the flat tensor's current values. Views that see
/// through wrappers (the reference unwrap) show the held parameters where they belong.
///
///   class MyShardImpl : public wrapcert::WrapperImpl {
///    public:
///     explicit MyShardImpl(wrapcert::ModulePtr inner)
///         : WrapperImpl("MyShard", "_sharded", std::move(inner)) {
///       flat_.take(*this, "_flat", this->inner());
///     }
///     wrapcert::ModulePtr release() { flat_.restore(); return inner(); }
///    protected:
///     torch::Tensor run(const torch::Tensor& x) override {
///       const auto unsharded = flat_.unshard();
///       return wrapcert::call(*inner(), x);
///     }
///    private:
///     wrapcert::FlatParameters flat_;
///   };
///
/// Its kind declares `owned_state = {"_flat"}`, `numerics = Numerics::kNeedsRelease` and a
/// `release` calling the wrapper's; certification checks all three.

#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace wrapcert {

class FlatParameters {
 public:
  /// One original parameter: where it was registered, the very tensor, and its place in the
  /// flat tensor.
  struct Piece {
    std::shared_ptr<torch::nn::Module> owner;
    std::string name;
    torch::Tensor original;
    int64_t offset = 0;
  };

  FlatParameters() = default;
  FlatParameters(const FlatParameters&) = delete;
  FlatParameters& operator=(const FlatParameters&) = delete;
  ~FlatParameters();

  /// Takes the parameters of `inner`'s subtree (each module once; a tied tensor stored once),
  /// not entering modules for which `skip` is true and leaving out what a nested wrapper of a
  /// registered kind declares as its own state (its flat tensor) and what another
  /// `FlatParameters` holds now (a tie across units stays with the unit that took it first: the
  /// module here keeps it registered), and registers the flat tensor on
  /// `holder` as `name`. The originals become views of it, so their values follow it. Throws
  /// `Error` (kInvalidArgument, naming the key) when dtypes or devices differ, or when already
  /// holding.
  void take(torch::nn::Module& holder, std::string name,
            const std::shared_ptr<torch::nn::Module>& inner,
            const std::function<bool(const torch::nn::Module&)>& skip = nullptr);

  /// Holds a flat tensor now (taken, not yet restored).
  bool holding() const { return holder_ != nullptr; }
  const std::vector<Piece>& pieces() const { return pieces_; }
  /// The flat tensor registered on the holder; undefined when not holding (nothing taken, or
  /// restored).
  torch::Tensor flat() const;

  /// While alive, views of the flat tensor stand where the originals were registered, so a
  /// forward reads them and gradients reach the flat tensor; removed again when it ends, also
  /// on an exception.
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
  /// Nothing to do (an empty guard) when not holding.
  [[nodiscard]] Unsharded unshard();
  /// The same with views of `whole` (a tensor of the flat tensor's size, e.g. gathered from the
  /// shards of the ranks, possibly in another dtype) in place of the registered flat tensor.
  [[nodiscard]] Unsharded unshard(const torch::Tensor& whole);
  /// The number of elements of the flat tensor (0 when not holding).
  int64_t numel() const { return numel_; }

  /// Registers every original again where it was, in its place among its module's parameters,
  /// and unregisters the flat tensor from the holder. A no-op when not holding.
  void restore();

 private:
  /// Drops this unit's pieces from the process-wide record of held parameters.
  void forget();

  torch::nn::Module* holder_ = nullptr;
  std::string name_;
  int64_t numel_ = 0;
  std::vector<Piece> pieces_;
};

}  // namespace wrapcert
