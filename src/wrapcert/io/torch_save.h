#pragma once
/// Reading and writing what people save with `torch.save`: the zip archive PyTorch writes since
/// 1.6 and the legacy format before it (`_use_new_zipfile_serialization=False`), a plain state
/// dict or one nested in a trainer's checkpoint (`{"model": ..., "optimizer": ..., "epoch": 3}`).
///
///   auto file = wrapcert::read_torch_save("trainer.pt");          // finds "model"
///   auto keys_only = wrapcert::read_torch_save("big.pt", {/*data=*/false});  // on meta
///   wrapcert::save_torch_save("clean.pt", file.state);            // torch.load reads it

#include <wrapcert/view.h>

#include <string>
#include <utility>
#include <vector>

namespace wrapcert {

struct TorchSaveOptions {
  /// Read tensor data; false gives every tensor on the meta device (keys, shapes, dtypes,
  /// strides, offsets and ties) and reads nothing but the pickle and the archive's directory.
  bool data = true;
  /// Where a nested checkpoint keeps its state dict ("model", "a.b"); empty: the root when it
  /// is a dict of tensors, else the first of `state_dict`, `model`, `module`,
  /// `model_state_dict` that is one.
  std::string entry;
};

struct TorchSaveFile {
  StateDict state;     ///< in saved order; tensors that shared a storage in Python share it here
  std::string format;  ///< "torch.save zip" or "torch.save legacy"
  std::string entry;   ///< the nested entry used, "" for the root
  std::vector<std::string> other_entries;  ///< the root's entries beside it
  /// The root's other entries that hold state dicts too (timm's `state_dict_ema`), when no entry
  /// was asked for: read each by naming it.
  std::vector<std::string> more_state_dicts;
};

/// Throws `Error` naming the file, and the key where there is one: kMalformedInput for a damaged
/// archive, a storage whose size does not match, an unknown format, or a chosen entry that is
/// missing or holds something other than tensors; kUnsupported, with the way out, for what is
/// no state dict (a TorchScript archive, a pickled module) or one rank's part of a sharded one;
/// kInvalidArgument for a path that is not a regular file.
TorchSaveFile read_torch_save(const std::string& path, const TorchSaveOptions& options = {});

/// Every tensor of a saved state dict, on the CPU, in saved order: `read_torch_save(path).state`.
StateDict load_torch_save(const std::string& path);

/// Writes `state` as Python's `torch.save(state_dict)` does: a zip archive through LibTorch's
/// archive writer whose pickle is an `OrderedDict` of `torch._utils._rebuild_tensor_v2` calls, so
/// `torch.load(path, weights_only=True)` reads it; entries that share a storage (ties, views)
/// share it in the file. Written atomically, one storage at a time.
void save_torch_save(const std::string& path, const StateDict& state);

/// Copies the `torch.save` file at `source` (zip or legacy) to `destination` with the keys of
/// its state dict renamed (`renames`: old key -> new key). Only the pickle's key strings change:
/// the trainer's entries beside the state dict (optimizer, scheduler, epoch, objects of classes
/// wrapcert does not know), every storage and every other record are kept byte for byte, and
/// nothing in the file is executed. `entry` chooses the state dict as in `TorchSaveOptions`.
/// Holds one record in memory at a time; written atomically (`source` may be `destination`).
void rewrite_torch_save(const std::string& source, const std::string& destination,
                        const std::vector<std::pair<std::string, std::string>>& renames,
                        const std::string& entry = "");

/// A state dict of a file (`entry` as in `TorchSaveOptions`) and its keys' renames.
struct EntryRenames {
  std::string entry;
  std::vector<std::pair<std::string, std::string>> renames;
};
/// As above, renaming the keys of several state dicts of the file in one pass (a model's and its
/// EMA's), so the file is never half renamed.
void rewrite_torch_save(const std::string& source, const std::string& destination,
                        const std::vector<EntryRenames>& entries);

}  // namespace wrapcert
