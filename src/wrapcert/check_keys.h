#pragma once
/// What a training pipeline runs after saving a checkpoint: compare its keys with what the model
/// expects, find leftover wrapper components, and the translation that would fix them.
///
///   auto found = wrapcert::key_infos(wrapcert::read_safetensors_header("ckpt.safetensors"));
///   auto report = wrapcert::check_keys(found, wrapcert::key_infos(state_dict(model)));
///   if (report.status == wrapcert::KeyStatus::kFixable) ... report.translation ...

#include <wrapcert/safetensors.h>

#include <string>
#include <utility>
#include <vector>

namespace wrapcert {

struct KeyInfo {
  std::string key;
  std::vector<int64_t> shape;
  c10::ScalarType dtype;
};

std::vector<KeyInfo> key_infos(const SafetensorsHeader& header, const std::string& path = "");
/// A checkpoint file's keys, by its content: a `torch.save` zip archive or safetensors.
std::vector<KeyInfo> checkpoint_key_infos(const std::string& path);
/// A checkpoint file's tensors, by its content, as `checkpoint_key_infos`.
StateDict load_checkpoint(const std::string& path);
std::vector<KeyInfo> key_infos(const StateDict& state);

enum class KeyStatus { kClean, kFixable, kBroken };
const char* to_string(KeyStatus status);

struct KeyReport {
  KeyStatus status = KeyStatus::kClean;
  /// Keys that carry a registered wrapper's slot as a whole component, with its position.
  std::vector<std::pair<std::string, std::string>> leftover;     // key, "component N: slot"
  std::vector<std::pair<std::string, std::string>> translation;  // found key -> expected key
  std::vector<std::string> missing;     ///< expected, not found even after translation
  std::vector<std::string> unexpected;  ///< found, matching nothing
  std::vector<std::string> mismatched;  ///< "key: found [..] dtype, expected [..] dtype"
};

/// Matches `found` to `expected`: a found key that is not expected is translated by removing
/// whole components that are registered slot names, when exactly one such removal gives an
/// expected key no other found key has.
KeyReport check_keys(const std::vector<KeyInfo>& found, const std::vector<KeyInfo>& expected,
                     const Registry& registry = Registry::global());

std::string to_text(const KeyReport& report);

}  // namespace wrapcert
