#pragma once
/// Checkpoint files as training runs write them: one file (safetensors, or `torch.save` in the
/// zip or the legacy format, plain or nested in a trainer's dict), an index with its shards
/// (`model.safetensors.index.json`, `pytorch_model.bin.index.json`) or a folder of shards, read
/// as one checkpoint with every shard validated; and written back in the same shape.
///
///   auto listing = wrapcert::read_checkpoint("run/", {/*data=*/false});  // keys, shapes, ties
///   auto full = wrapcert::read_checkpoint("trainer.pt");   // finds the "model" entry
///   wrapcert::write_checkpoint("clean.safetensors", full);

#include <wrapcert/io/torch_save.h>
#include <wrapcert/view.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace wrapcert {

struct CheckpointReadOptions {
  /// Read tensor data; false gives every tensor on the meta device (keys, shapes, dtypes,
  /// strides and ties) and reads only headers, pickles and archive directories.
  bool data = true;
  /// Where a nested `torch.save` checkpoint keeps its state dict ("model", "a.b"); empty: the
  /// root, or the first of `state_dict`, `model`, `module`, `model_state_dict` that holds one.
  std::string entry;
};

struct Checkpoint {
  struct Shard {
    std::string file;               ///< the file's path
    std::vector<std::string> keys;  ///< its keys, in saved order
  };
  StateDict state;     ///< every key in order: shard by shard, each in saved order
  std::string format;  ///< "safetensors", "torch.save zip", "torch.save legacy"
  std::string entry;   ///< the nested entry that held the state dict, "" the root
  std::vector<std::string> other_entries;  ///< the trainer's entries beside it
  /// Entries beside `entry` that hold state dicts too (timm's `state_dict_ema`, a `model_ema`),
  /// found when no entry was asked for: each is read by naming it and checked on its own.
  std::vector<std::string> more_state_dicts;
  std::string index;          ///< the index file read, "" when there is none
  std::vector<Shard> shards;  ///< every file read (one for a single file)
  /// Every entry of the folder read that was not read, by name in name order ("unet/" for a
  /// folder, "global_step10/..." inside DeepSpeed's step): a trainer's state (optimizer.pt,
  /// random_states_0.pkl), configuration and tokenizer files, `.bin` files beside safetensors,
  /// other ranks' DeepSpeed model states. Kept as they are; nothing in a folder goes unnamed.
  std::vector<std::string> not_read;
  /// How the weights were chosen in a folder, one line each ("followed DeepSpeed's 'latest' to
  /// global_step10", "safetensors weights preferred over the others, as Transformers loads them").
  std::vector<std::string> notes;

  /// Variants of the weights in the folder read, each a checkpoint of its own to check by its
  /// path (diffusers' and Transformers' `variant`: `model.fp16.safetensors` beside
  /// `model.safetensors`, a sharded variant by its `model.safetensors.index.fp16.json`).
  std::vector<std::string> variants;

  /// What was read when a folder's weights are per rank and only one rank was read ("the first of
  /// 2 ranks"): a fix would leave the other ranks' files as they are. "" when all was read.
  std::string partial;

  /// A checkpoint read from inside a tar archive (NeMo's `.nemo`): the archive's path and the
  /// member read, as stored ("./model_weights.ckpt"); the one shard is then that member's copy
  /// in an unnamed scratch file of this process ("/proc/self/fd/N"), gone with the last copy of
  /// this `Checkpoint` (or the process, however it ends).
  std::string archive;
  std::string archive_member;
  std::shared_ptr<const void> scratch;

  bool sharded() const { return !index.empty() || shards.size() > 1; }
  /// The files read: the index (if any) and every shard; for an archive, the archive.
  std::vector<std::string> files() const;
};

/// Reads `path`: a file (by its content), an index (`*.index.json`, shards in its folder), or a
/// folder as trainers write them: DeepSpeed's root is followed through its `latest`; then its
/// one index (a safetensors index preferred), else its weights — every `*.safetensors` file,
/// or when there is none every `*.bin`, `*.pt`, `*.pth` file, in name order, passing over the
/// training state beside them (`Checkpoint::not_read`) and reading the first of DeepSpeed's
/// per-rank model states. Symbolic links in a folder are followed where they stay within it or,
/// for a snapshot of a Hugging Face cache (`models--org--name/snapshots/REV`), within that
/// model's cache folder (its `blobs`); a link leading elsewhere, a loop or a link to nothing is
/// kMalformedInput naming the link. A tar archive, plain or gzipped (NeMo's `.nemo`, by its
/// content), is listed with every member's name checked and its `model_weights.ckpt` read (at
/// its root, else the first rank's, `mp_rank_00/`), every other member in `not_read`; a member
/// outside the archive's folder is kMalformedInput naming it and its header's byte. A
/// `torch.distributed.checkpoint` folder (or its `.metadata`)
/// is read by `read_distributed_checkpoint`: format "torch.distributed.checkpoint", `index` its
/// `.metadata`, a shard per `.distcp` file; a `.distcp` file alone is kUnsupported. Throws `Error`
/// naming the file, and the key where there is one: kMalformedInput for a damaged file, an index
/// whose `weight_map` misses a key of a shard or places it elsewhere, a key in two shards, or a
/// shard named outside the index's folder; kInvalidArgument for a path that is missing or not a
/// regular file or folder (FIFOs, devices and sockets are refused by type before any read).
Checkpoint read_checkpoint(const std::string& path, const CheckpointReadOptions& options = {});

/// A diffusers pipeline folder: `model_index.json` naming a folder per component.
struct Pipeline {
  /// The components whose folders hold weights (`unet`, `text_encoder`, `vae`), in the
  /// index's order: each is a checkpoint of its own model, read by naming its folder.
  std::vector<std::string> components;
  /// Every other entry by name, in name order: `model_index.json`, components that hold no
  /// weights (`scheduler/`, `tokenizer/`), anything else in the folder.
  std::vector<std::string> not_read;
};

/// The pipeline in `folder` when it holds a `model_index.json`, else nothing. Throws `Error`
/// (kMalformedInput) naming the index and the component for damage: JSON that is not an object
/// or repeats a key, a component that is not a folder name or whose folder is missing. Links
/// are followed as `read_checkpoint` follows them. `read_checkpoint` on a pipeline folder is
/// kUnsupported naming each component's folder.
std::optional<Pipeline> read_pipeline(const std::string& folder);

/// Keys grouped by the data they share (one storage at the same offset, shape, strides and
/// dtype, as `torch.save` keeps a tied weight): each group of two or more, in saved order.
std::vector<std::vector<std::string>> storage_ties(const StateDict& state);

/// `Checkpoint::format` of a `torch.distributed.checkpoint` folder.
inline constexpr const char* kDistributedCheckpointFormat = "torch.distributed.checkpoint";

enum class CheckpointFormat { kSafetensors, kTorchSave, kDistributedCheckpoint, kArchive };
/// The format a destination's name asks for: `.safetensors` (or `*.safetensors.index.json`);
/// `.pt`, `.pth`, `.bin`, `.ckpt` (or `*.bin.index.json`, `*.pt.index.json`) for `torch.save`;
/// `.metadata` or `*.distcp` for a `torch.distributed.checkpoint`, `.nemo`, `.tar`, `.tar.gz` or
/// `.tgz` for a tar archive (each written only as a fix of one).
/// Throws `Error` (kInvalidArgument) naming the path for any other name.
CheckpointFormat format_for(const std::string& destination);

/// What `write_checkpoint(destination, checkpoint)` would write, in order: one file, or for a
/// sharded checkpoint written to an index (or a folder) the shards and then the index.
std::vector<std::string> planned_files(const std::string& destination,
                                       const Checkpoint& checkpoint);

/// Refuses, with an `Error` (kInvalidArgument) naming the path, a destination that is empty,
/// exists but is not a regular file (a device, FIFO, socket, folder or symbolic link), lies in a
/// folder that is missing or not writable, has a name of no known format, or is one of `inputs`
/// (unless `in_place`). Reads and writes nothing.
void check_destination(const std::string& destination, const std::vector<std::string>& inputs,
                       bool in_place);

struct CheckpointWriteOptions {
  /// Called with each path once it is written or moved into place, in order (progress; a test
  /// stops a run at each step and checks that the checkpoint still loads).
  std::function<void(const std::string& path)> on_file;
  /// In safetensors, store every key of a tie as its own copy, where by default a tie is stored
  /// once and the other keys listed (see `save_safetensors`).
  bool tie_copies = false;
};

/// Writes `checkpoint.state` to `destination` in the format its name asks for; a sharded
/// checkpoint written to an index or a folder keeps its shards (each key in the shard it came
/// from) and gets an index with a `weight_map`. Ties are kept: one stored tensor in
/// safetensors, one storage in `torch.save`.
///
/// Nothing is half-replaced: a single file is written atomically; a sharded checkpoint is first
/// written whole under temporary names (`.NAME.wrapcert-new` beside each shard), an index naming
/// those is put in place, each shard then gets its own name by an atomic link, and an index
/// naming those is put in place last. A run stopped at any point (killed, or out of space)
/// leaves a checkpoint that loads: the old one before the first index, the new one after (its
/// index naming the temporary shards until the last step).
void write_checkpoint(const std::string& destination, const Checkpoint& checkpoint,
                      const CheckpointWriteOptions& options = {});

/// Writes the checkpoint `source` (as `read_checkpoint` listed it; data need not be read) to
/// `destination` with its keys renamed (`renames`: found -> expected), shard by shard and
/// atomically as `write_checkpoint` does, reading each source file when its turn comes. A
/// `torch.save` file written as `torch.save` is copied with only its key strings rewritten
/// (`rewrite_torch_save`), so the entries beside a nested state dict are kept; a safetensors
/// file keeps its `__metadata__`. The index keeps its own entries besides the `weight_map`. An
/// archive written as an archive is copied member by member (same tar format and compression)
/// with its weights member's key strings rewritten, atomically.
void write_fixed_checkpoint(const std::string& destination, const Checkpoint& source,
                            const std::vector<std::pair<std::string, std::string>>& renames,
                            const CheckpointWriteOptions& options = {});

/// As above, and the state dicts of `source.more_state_dicts` renamed too (`more`: an entry and
/// its renames each), all in the one file written. Only a single `torch.save` file written as
/// `torch.save` holds several state dicts: otherwise throws `Error` (kUnsupported) naming them.
void write_fixed_checkpoint(const std::string& destination, const Checkpoint& source,
                            const std::vector<std::pair<std::string, std::string>>& renames,
                            const std::vector<EntryRenames>& more,
                            const CheckpointWriteOptions& options = {});

/// `checkpoint` with keys renamed (found -> expected); tensors, order, ties and shards kept.
Checkpoint rename_keys(const Checkpoint& checkpoint,
                       const std::vector<std::pair<std::string, std::string>>& renames);

namespace detail {
/// The `weight_map` of an index file's text, in order: key -> shard file name. Throws `Error`
/// (kMalformedInput) naming `path` and the key for damage (a repeated key, a value that is not
/// a plain file name in the index's folder).
std::vector<std::pair<std::string, std::string>> parse_shard_index(const std::string& text,
                                                                   const std::string& path);
}  // namespace detail

}  // namespace wrapcert
