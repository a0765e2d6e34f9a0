#pragma once
/// What a training pipeline runs after saving a checkpoint: compare its keys with what the model
/// expects, find leftover wrapper components, and the translation that would fix them.
///
///   auto found = wrapcert::key_infos(wrapcert::read_checkpoint("ckpt/", {false}).state);
///   auto report = wrapcert::check_keys(found, wrapcert::key_infos(state_dict(model)));
///   if (report.status == wrapcert::KeyStatus::kFixable) ... report.translation ...
///   auto scan = wrapcert::scan_keys(found);   // no reference: wrapper components only

#include <wrapcert/io/checkpoint_file.h>
#include <wrapcert/registry.h>
#include <wrapcert/view.h>

#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

namespace wrapcert {

struct KeyInfo {
  std::string key;
  std::vector<int64_t> shape;
  c10::ScalarType dtype = c10::kFloat;
  /// The first key saved with the very same data (a tie), or "".
  std::string tied_to;
  /// False for a module's extra state saved as something other than a tensor (no shape).
  bool tensor = true;
  /// Why the key cannot load into a model as saved (a flat parameter, a ZeRO-3 placeholder),
  /// with the way out; "" when it can.
  std::string cannot_load;
};

/// Keys, shapes, dtypes and ties (by storage, offset, shape and strides) of a state dict; the
/// tensors may be on the meta device.
std::vector<KeyInfo> key_infos(const StateDict& state);

/// As above, for a checkpoint read from disk, with what cannot load as saved named: FSDP's flat
/// parameters, and ZeRO-3 placeholders in DeepSpeed's model states (shape [0] beside its
/// `ds_version` or `param_shapes`).
std::vector<KeyInfo> key_infos(const Checkpoint& checkpoint);

enum class KeyStatus {
  kClean,     ///< every key as expected (a scan: no wrapper component)
  kFixable,   ///< a one-to-one translation gives the expected keys
  kBroken,    ///< keys missing, unexpected or mismatched, or keys that cannot load as saved
  kLeftover,  ///< a scan without a reference found wrapper components
};
const char* to_string(KeyStatus status);

struct KeyReport {
  KeyStatus status = KeyStatus::kClean;
  /// Wrapper components in found keys, as "component N: slot": with a reference, the
  /// components the translation removes (and, in keys that match nothing, every slot name the
  /// scan would report); in a scan, every component that only a wrapper puts there.
  std::vector<std::pair<std::string, std::string>> leftover;
  std::vector<std::pair<std::string, std::string>> translation;  // found key -> expected key
  std::vector<std::string> missing;     ///< expected, not found even after translation
  std::vector<std::string> unexpected;  ///< found, matching nothing
  std::vector<std::string> mismatched;  ///< "key: found [..] dtype, expected [..] dtype"
  std::vector<std::pair<std::string, std::string>> ties;  ///< found key -> key it is tied to
  /// Expected keys tied to a found one and left out of the file (found key's tie, as
  /// Transformers saves a tied head): expected key -> the key it is tied to. Not missing.
  std::vector<std::pair<std::string, std::string>> tied_left_out;
  /// Found keys that cannot load as saved -> why, and the way out. Makes the status broken.
  std::vector<std::pair<std::string, std::string>> unloadable;
};

struct CheckKeysOptions {
  /// Compare shapes and dtypes too; a key listing has names only.
  bool compare_shapes = true;
  /// With `compare_shapes`, compare dtypes too; a variant of the weights (`model.fp16.*`) is
  /// the reference's model in another dtype.
  bool compare_dtypes = true;
};

/// Matches `found` to `expected`: a found key that is not expected is translated by removing
/// whole components that are registered slot names, when exactly one such removal gives an
/// expected key no other found key has. A checkpoint on disk has no tree to translate by (as
/// `KeyTranslator::from_tree` does, keys.h): the expected keys stand in for it, so a removal
/// counts only where it lands on one of them, one to one.
KeyReport check_keys(const std::vector<KeyInfo>& found, const std::vector<KeyInfo>& expected,
                     const Registry& registry = Registry::global(),
                     const CheckKeysOptions& options = {});

/// Without a reference: every whole component of a found key that is a registered slot name.
/// A slot name a user may also give a child (`module`, no leading underscore) counts only as
/// the first component, where DataParallel, DistributedDataParallel and DeepSpeed put it.
KeyReport scan_keys(const std::vector<KeyInfo>& found,
                    const Registry& registry = Registry::global());

/// The report as `check-keys` prints it, written to `out` as it goes (a report of 300,000 keys
/// is not built in memory first).
void print(std::ostream& out, const KeyReport& report);
std::string to_text(const KeyReport& report);

/// The keys of a key listing (what `--keys` reads): one key per line; what follows a space or
/// a tab (a golden listing's shape and dtype) is ignored, and so are blank lines. Shapes and
/// dtypes are unknown: compare with `CheckKeysOptions::compare_shapes` off. Throws `Error`
/// (kInvalidArgument) naming the file when it cannot be read, is a folder, or holds no key.
std::vector<KeyInfo> read_key_listing(const std::string& path);

}  // namespace wrapcert
