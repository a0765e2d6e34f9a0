#pragma once
/// `torch.distributed.checkpoint` folders, as FSDP's sharded checkpoints and torch_xla's
/// distributed checkpoints are written: a `.metadata` pickle (every key's shape, dtype and chunks,
/// and where each chunk's bytes lie) beside `.distcp` files of chunks. The metadata is read
/// through an allow-list of DCP's own classes, executing nothing; a `.distcp` file is only sized.
///
///   auto dcp = wrapcert::read_distributed_checkpoint("step_500/");   // keys on meta
///   wrapcert::write_renamed_distributed_checkpoint("step_500/", "fixed/", dcp.entry, renames);

#include <wrapcert/view.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace wrapcert {

struct DistributedCheckpoint {
  std::string metadata;  ///< the `.metadata` file read
  /// Every key of the chosen state dict in saved order, each a meta tensor of the full shape and
  /// dtype; an item saved as bytes (a step count, extra state) is an undefined tensor.
  StateDict state;
  /// The top-level entry of a nested state dict read ("model" of `{"model": ..., "optim": ...}`),
  /// "" when the keys are the saved ones.
  std::string entry;
  std::vector<std::string> other_entries;  ///< the other top-level entries, not read
  /// Each `.distcp` file the metadata names, in name order, with the keys that have a chunk in it.
  std::vector<std::pair<std::string, std::vector<std::string>>> files;
};

/// Reads `folder/.metadata` and checks it against the folder: every key has chunks that cover its
/// shape, every chunk has its bytes in a `.distcp` file of the folder (a plain name, a regular
/// file, long enough). `entry` chooses a top-level entry of a nested state dict ("" the first of
/// `state_dict`, `model`, `module`, `model_state_dict` when the keys are nested, else the keys as
/// saved). Throws `Error` naming the file, and the key where there is one: kMalformedInput for a
/// damaged pickle (with its byte), a class DCP does not write, a chunk outside its tensor, a
/// `.distcp` shorter than the metadata says; kInvalidArgument for a folder without `.metadata`.
DistributedCheckpoint read_distributed_checkpoint(const std::string& folder,
                                                  const std::string& entry = "");

/// Writes the checkpoint at `source` (a folder) to `destination` (a folder) with the keys of
/// `entry`'s state dict renamed (`renames`: key as read -> new key). Only the metadata's key
/// strings change (the state dict's keys, each chunk's index and the planner's key mapping): every
/// other byte of `.metadata` and every `.distcp` byte is kept, so
/// `torch.distributed.checkpoint.load` reads the result. In place (`destination` is `source`),
/// `.metadata` alone is replaced, atomically; elsewhere each `.distcp` is copied first and
/// `.metadata` written last, to a folder that holds no checkpoint yet. `on_file` is called with
/// each path written. Throws `Error` naming the key (kUnsupported) when a renamed key's string is
/// also used for something else, or a renaming would change a nested entry's name; nothing is
/// written then.
void write_renamed_distributed_checkpoint(
    const std::string& source, const std::string& destination, const std::string& entry,
    const std::vector<std::pair<std::string, std::string>>& renames,
    const std::function<void(const std::string&)>& on_file = {});

}  // namespace wrapcert
