#pragma once
/// The pickle machine behind `read_torch_save`, apart from the file formats, so it can be tested
/// and fuzzed on its own. It executes nothing: classes it does not know become opaque values,
/// which are an error only where a tensor is expected.

#include <wrapcert/view.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace wrapcert::detail {

/// A storage that a pickle names: its key in the archive ("0"), its dtype and element count.
struct PickledStorage {
  std::string key;
  c10::ScalarType dtype;
  int64_t numel = 0;
};

/// Where a key's string lies in the pickle: the opcode that pushes it, [begin, end).
struct PickledKey {
  size_t begin = 0;
  size_t end = 0;
  /// The pickle refers to the same string again elsewhere (through its memo).
  bool reused = false;
  /// How much of the key its nested dicts spell ("language_model.embedding." of
  /// "language_model.embedding.word_embeddings.weight"); the string holds the rest.
  size_t prefix = 0;
};

/// `PickledStateDict::storage_of` for a value that is no tensor.
constexpr size_t kNoStorage = static_cast<size_t>(-1);

struct PickledStateDict {
  /// The state dict with every tensor on the meta device: shapes, strides, storage offsets and
  /// shared storages as saved, no data. A module's extra state (`..._extra_state`) that is not a
  /// tensor (an int, bytes, a dict) is an undefined tensor here: its key is kept, its value is
  /// left in the pickle.
  StateDict state;
  /// For each entry of `state`, in order, its storage's index in `storages` (`kNoStorage` for
  /// extra state that is not a tensor).
  std::vector<size_t> storage_of;
  /// Every storage the pickle names (the chosen state dict's and any other's), in order.
  std::vector<PickledStorage> storages;
  /// The nested entry that holds the state dict ("model", "a.b"), "" for the root.
  std::string entry;
  /// The root's other entries when the state dict is nested ("optimizer", "epoch").
  std::vector<std::string> other_entries;
  /// The root's other entries that hold state dicts too (timm's "state_dict_ema"), when no
  /// entry was asked for; not in `other_entries`.
  std::vector<std::string> more_state_dicts;
  /// For each entry of `state`, in order, where its key is spelled.
  std::vector<PickledKey> key_spans;
  /// Where each FRAME opcode (protocol 4 and later) starts.
  std::vector<size_t> frames;
  /// One past the pickle's STOP opcode.
  size_t end = 0;
};

/// The entries where trainers keep the state dict, tried in this order when the root is not
/// itself a dict of tensors.
const std::vector<std::string>& usual_state_dict_entries();

/// Runs the pickle at `data[0, size)` of a `torch.save`d checkpoint and finds the state dict in
/// it: at `entry` (dotted) when given, else the root when it is a dict of tensors, the first
/// usual entry that is one, or the root when it nests dicts of tensors. Dicts of tensors nested in
/// the state dict (Megatron's) give keys joined with '.'. Throws `Error` naming `path`, and the
/// key where there is one: kMalformedInput for damage, kUnsupported for what is not a state dict
/// but has a way out (a pickled module, one rank's ShardedTensor or DTensor).
PickledStateDict read_state_dict_pickle(const char* data, size_t size, const std::string& path,
                                        const std::string& entry = "");

using KeyRenames = std::vector<std::pair<std::string, std::string>>;

/// The pickle `data[0, pickled.end)` with the state dict's keys renamed (`renames`: old key ->
/// new key) and every other byte as it was, so that a trainer's entries beside the state dict
/// are kept without being executed. Frames are dropped (they are optional; their lengths would
/// no longer hold). Throws `Error` naming the key: kMalformedInput when a renamed key's string
/// is referred to elsewhere in the pickle, where renaming it would change that too;
/// kUnsupported when a renaming changes the nested dicts that hold the key.
std::string rename_pickled_keys(const char* data, const PickledStateDict& pickled,
                                const KeyRenames& renames, const std::string& path);

/// As above for several state dicts of one pickle (each read from the same `data`), each with
/// its renames: a file's model and its EMA renamed in one pass.
std::string rename_pickled_keys(
    const char* data,
    const std::vector<std::pair<const PickledStateDict*, const KeyRenames*>>& parts,
    const std::string& path);

}  // namespace wrapcert::detail
