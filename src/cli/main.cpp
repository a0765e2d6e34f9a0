// wrapcert: the command-line tool. `wrapcert demo` shows the seed's bug and its fix.

#include "serve.h"

#include <wrapcert/certify/certify.h>
#include <wrapcert/certify/hardware.h>
#include <wrapcert/certify/launch.h>
#include <wrapcert/certify/ranks.h>
#include <wrapcert/distributed.h>
#include <wrapcert/fixtures/causal_lm.h>
#include <wrapcert/fixtures/certification.h>
#include <wrapcert/fixtures/demo.h>
#include <wrapcert/io/check_keys.h>
#include <wrapcert/io/checkpoint_file.h>
#include <wrapcert/io/detail/atomic_file.h>
#include <wrapcert/io/safetensors.h>
#include <wrapcert/plugin.h>
#include <wrapcert/python/bridge.h>
#include <wrapcert/python/certify_python.h>
#include <wrapcert/wrapcert.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>

namespace {

/// Exit codes (also in `--help` and the README).
constexpr int kExitFound = 1;        // fixable checkpoint, wrapper components found, failed check
constexpr int kExitBroken = 2;       // broken checkpoint (keys that do not load), or a damaged file
constexpr int kExitUnsupported = 3;  // a valid file that wrapcert does not read
constexpr int kExitUsage = 64;       // the command line itself is wrong (sysexits' EX_USAGE)
constexpr int kExitNoInput = 66;     // an input cannot be read (sysexits' EX_NOINPUT)
constexpr int kExitCannotWrite = 73;  // an output cannot be written (sysexits' EX_CANTCREAT)

// Built with AddressSanitizer: the tool leaves through `std::exit`, where LeakSanitizer looks.
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define WRAPCERT_LEAK_CHECKED_EXIT 1
#endif
#elif defined(__SANITIZE_ADDRESS__)
#define WRAPCERT_LEAK_CHECKED_EXIT 1
#endif

/// Ends the tool with `code` once a command is done and everything it wrote is out. Each
/// command's own objects are gone by then (its function returned); what `std::exit` would still
/// run are the static destructors, LibTorch's taking its operator registry down (~0.2 s, at
/// every run). Under AddressSanitizer the normal exit stays, so that LeakSanitizer still looks.
[[noreturn]] void finish(int code) {
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
#ifdef WRAPCERT_LEAK_CHECKED_EXIT
  std::exit(code);
#else
  std::_Exit(code);
#endif
}

/// An `Error` while reading inputs or writing outputs, as the exit code it means.
int exit_code_for(const wrapcert::Error& e, int invalid_argument) {
  switch (e.code()) {
    case wrapcert::ErrorCode::kUnsupported:
      return kExitUnsupported;
    case wrapcert::ErrorCode::kInvalidArgument:
      return invalid_argument;
    default:
      return kExitBroken;
  }
}

/// Runs `step`; an `Error` from it is printed and becomes its exit code (`invalid_argument` for
/// a path refused or unreadable), else -1.
template <typename Step>
int guarded(int invalid_argument, const Step& step) {
  try {
    step();
  } catch (const wrapcert::Error& e) {
    std::cerr << e.what() << "\n";
    return exit_code_for(e, invalid_argument);
  }
  return -1;
}

/// Memory the kernel says a new allocation can have, in bytes (0 when unknown).
uint64_t available_memory() {
  std::ifstream in("/proc/meminfo");
  std::string name;
  uint64_t kib = 0;
  std::string unit;
  while (in >> name >> kib >> unit) {
    if (name == "MemAvailable:") return kib * 1024;
  }
  return 0;
}

std::string gigabytes(uint64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f GB", static_cast<double>(bytes) / 1e9);
  return text;
}

/// Refuses to build weights that cannot fit in memory, naming the estimate; says what a long
/// build is doing before it starts.
void check_fits(const std::string& what, uint64_t bytes) {
  const uint64_t available = available_memory();
  if (available && bytes > available) {
    throw wrapcert::Error(wrapcert::ErrorCode::kInvalidArgument, "",
                          what + " needs about " + gigabytes(bytes) +
                              " for its weights; this machine has " + gigabytes(available) +
                              " available");
  }
  if (bytes > (uint64_t{1} << 28)) {
    std::cerr << "wrapcert: building " << what << " (about " << gigabytes(bytes)
              << " of weights)..." << std::endl;
  }
}

/// Bytes of the distinct tensors of a model built on the meta device.
uint64_t weight_bytes(const wrapcert::ModulePtr& model) {
  uint64_t total = 0;
  for (const auto& info : wrapcert::key_infos(wrapcert::state_dict(model))) {
    if (!info.tied_to.empty()) continue;
    uint64_t n = c10::elementSize(info.dtype);
    for (auto d : info.shape) n *= static_cast<uint64_t>(d);
    total += n;
  }
  return total;
}

struct DemoOptions {
  int64_t layers = 2;
  int64_t hidden = 8;
  bool libtorch_style = false;
  bool no_compress = false;
};

/// The seed's recipe on the demo model: a wrapper around every decoder layer and the root.
wrapcert::ModulePtr wrapped_demo(const DemoOptions& o) {
  wrapcert::fixtures::DemoConfig config;
  config.layers = o.layers;
  config.hidden = o.hidden;
  return wrapcert::auto_wrap(wrapcert::fixtures::make_demo_model(config),
                             {wrapcert::fixtures::kDemoNoSplitModule},
                             "SpmdFullyShardedDataParallel");
}

int run_demo(const DemoOptions& o) {
  const wrapcert::fixtures::DemoConfig config;
  const auto h = static_cast<uint64_t>(o.hidden);
  const auto inter = static_cast<uint64_t>(config.intermediate);
  const uint64_t params = static_cast<uint64_t>(o.layers) * (4 * h * h + 3 * h * inter + 2 * h) +
                          static_cast<uint64_t>(config.vocab) * h + h;
  // Each subject gets a fresh copy, built one after another.
  check_fits("the demo model (" + std::to_string(o.layers) + " layers, hidden " +
                 std::to_string(o.hidden) + ")",
             params * sizeof(float) * 2);
  wrapcert::PrintOptions print;
  print.style = o.libtorch_style ? wrapcert::PrintStyle::kLibTorch : wrapcert::PrintStyle::kPython;
  print.compress_repeated = !o.no_compress;

  auto wrapped = wrapped_demo(o);
  const auto total = wrapcert::unwrap_reference(wrapped).state_dict().size();
  std::cout << "A wrapped model (root and every decoder layer):\n\n"
            << wrapcert::format_tree(wrapped, print) << "\n\n";
  std::cout << "After the legacy unwrap (root chain only):\n\n"
            << wrapcert::format_tree(wrapcert::unwrap(wrapcert::BuiltinUnwrap::kLegacy, wrapped),
                                     print)
            << "\n\n";
  std::cout << "After the reference unwrap:\n\n"
            << wrapcert::format_tree(wrapcert::unwrap_reference(wrapped), print) << "\n\n";

  std::cout << "State-dict keys that still carry a wrapper slot:\n";
  for (auto subject : wrapcert::all_subjects()) {
    // The duck-typed subject rewires the model it is given, so each subject gets a fresh one.
    auto view = wrapcert::unwrap(subject, wrapped_demo(o));
    const auto left = wrapcert::wrapped_state(view);
    std::cout << "  " << wrapcert::to_string(subject) << ": " << left.size() << " of "
              << view.state_dict().size() << " (model has " << total << ")";
    if (!left.is_empty()) std::cout << ", e.g. " << left.begin()->key();
    std::cout << "\n";
  }
  return 0;
}

struct FixtureOptions {
  std::string name = "gemma-2b";
  std::string device = "meta";
  bool keys = false;
  bool wrapped = false;
  bool libtorch_style = false;
  std::string save;
};

wrapcert::PrintOptions print_options(bool libtorch_style) {
  wrapcert::PrintOptions print;
  print.style = libtorch_style ? wrapcert::PrintStyle::kLibTorch : wrapcert::PrintStyle::kPython;
  return print;
}

/// Builds a fixture as its checkpoint stores it (full-size ones on meta by default).
wrapcert::ModulePtr build_fixture(const wrapcert::fixtures::CausalLMConfig& config,
                                  const std::string& device) {
  wrapcert::fixtures::BuildOptions build;
  build.device = c10::Device(device);
  build.dtype = config.checkpoint_dtype;
  return wrapcert::fixtures::make_causal_lm(config, build);
}

int run_fixture(const FixtureOptions& o) {
  const auto config = wrapcert::fixtures::config_named(o.name);
  if (!o.save.empty() && o.device == "meta") {
    throw wrapcert::Error(wrapcert::ErrorCode::kInvalidArgument, "",
                          "--save writes the weights, which a model on the meta device does not "
                          "have: add --device cpu");
  }
  if (!o.save.empty()) wrapcert::check_destination(o.save, {}, /*in_place=*/false);
  const auto start = std::chrono::steady_clock::now();
  if (o.device != "meta") {
    check_fits(config.name + " on " + o.device, weight_bytes(build_fixture(config, "meta")));
  }
  auto model = build_fixture(config, o.device);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (seconds > 2)
    std::cerr << "wrapcert: built in " << static_cast<int>(seconds) << " s" << std::endl;
  if (o.wrapped) model = wrapcert::fixtures::apply_fsdp_v2_recipe(model, config);
  if (!o.save.empty()) {
    wrapcert::save_safetensors(o.save, wrapcert::state_dict(model), {{"format", "pt"}});
    return 0;
  }
  if (o.keys) {
    std::cout << wrapcert::format_keys(wrapcert::state_dict(model));
  } else {
    std::cout << wrapcert::format_tree(model, print_options(o.libtorch_style)) << "\n";
  }
  return 0;
}

struct CheckKeysCli {
  std::string file;
  std::string fixture;
  std::string against;
  std::string listing;
  std::string fix;
  bool fix_given = false;
  bool in_place = false;
  std::string entry;
  std::string ties = "once";
  bool variant = false;  // a variant of the weights: dtypes are its own
};

void describe_checkpoint(const std::string& path, const wrapcert::Checkpoint& c) {
  for (const auto& note : c.notes) std::cout << note << "\n";
  std::cout << "checkpoint: " << path << " (" << c.format;
  if (!c.entry.empty()) std::cout << ", state dict in entry '" << c.entry << "'";
  if (!c.archive.empty()) {
    std::cout << ", member " << c.archive_member << " of the archive";
  } else if (c.format == wrapcert::kDistributedCheckpointFormat) {
    std::cout << ", .metadata and " << c.shards.size() << " .distcp files";
  } else if (c.sharded()) {
    std::cout << ", " << c.shards.size() << " shards" << (c.index.empty() ? "" : " by its index");
  } else if (c.shards.size() == 1 && c.shards[0].file != path) {
    std::cout << ", " << c.shards[0].file;
  }
  std::cout << ", " << c.state.size() << " keys)\n";
  if (!c.more_state_dicts.empty()) {
    std::cout << "more state dicts in the file, each checked below:";
    for (const auto& e : c.more_state_dicts) std::cout << " " << e;
    std::cout << "\n";
  }
  if (!c.other_entries.empty()) {
    std::cout << "other entries, not checked:";
    for (const auto& e : c.other_entries) std::cout << " " << e;
    std::cout << "\n";
  }
  if (!c.not_read.empty()) {
    std::cout << "files beside the weights, not checked:";
    for (const auto& f : c.not_read) std::cout << " " << f;
    std::cout << "\n";
  }
}

/// Where --in-place writes: the checked file, or for a folder its index or its one weights file.
std::string in_place_destination(const std::string& file, const wrapcert::Checkpoint& c) {
  if (!std::filesystem::is_directory(file)) return file;
  if (!c.index.empty()) return c.index;
  if (c.shards.size() == 1) return c.shards[0].file;
  return file;
}

bool names_a_folder(const std::string& path) {
  return !path.empty() && (path.back() == '/' || std::filesystem::is_directory(path));
}

int run_check_keys(const CheckKeysCli& o);

/// A diffusers pipeline: each component with weights checked as its own checkpoint (against the
/// same component of a reference pipeline), fixed in place one by one; the worst verdict.
int run_check_pipeline(const CheckKeysCli& o, const wrapcert::Pipeline& pipeline) {
  if (!o.fixture.empty() || !o.listing.empty()) {
    throw CLI::ValidationError(
        o.fixture.empty() ? "--keys" : "--fixture",
        "a pipeline holds several models: check it --against another "
        "pipeline, or check one component by its folder (" +
            (std::filesystem::path(o.file) /
             (pipeline.components.empty() ? "unet" : pipeline.components.front()))
                .string() +
            ")");
  }
  if (o.fix_given) {
    throw CLI::ValidationError("--fix",
                               "a pipeline is fixed --in-place, component by component (on a "
                               "copy: cp -rL PIPELINE COPY), or one component by its folder");
  }
  std::optional<wrapcert::Pipeline> reference;
  if (!o.against.empty()) {
    if (const int code = guarded(kExitNoInput,
                                 [&] {
                                   if (names_a_folder(o.against))
                                     reference = wrapcert::read_pipeline(o.against);
                                 });
        code >= 0) {
      return code;
    }
    if (!reference) {
      throw CLI::ValidationError("--against",
                                 "a pipeline is checked against another pipeline (a folder "
                                 "with model_index.json), component by component");
    }
  }
  std::cout << "diffusers pipeline: " << o.file << " (" << pipeline.components.size()
            << " models with weights:";
  for (const auto& c : pipeline.components) std::cout << " " << c;
  std::cout << ")\n";
  if (!pipeline.not_read.empty()) {
    std::cout << "entries without weights, not checked:";
    for (const auto& e : pipeline.not_read) std::cout << " " << e;
    std::cout << "\n";
  }
  int verdict = 0;
  if (reference) {
    for (const auto& c : reference->components) {
      if (std::find(pipeline.components.begin(), pipeline.components.end(), c) ==
          pipeline.components.end()) {
        std::cout << "component " << c << ": missing (the reference pipeline has it)\n";
        verdict = std::max(verdict, kExitBroken);
      }
    }
  }
  for (const auto& c : pipeline.components) {
    std::cout << "\ncomponent " << c << ":\n";
    CheckKeysCli one = o;
    one.file = (std::filesystem::path(o.file) / c).string();
    if (reference) {
      if (std::find(reference->components.begin(), reference->components.end(), c) ==
          reference->components.end()) {
        std::cout << "not in the reference pipeline " << o.against << "\n";
        verdict = std::max(verdict, kExitBroken);
        continue;
      }
      one.against = (std::filesystem::path(o.against) / c).string();
    }
    verdict = std::max(verdict, run_check_keys(one));
  }
  return verdict;
}

/// 0 clean (with --fix: copied or converted), 1 fixable (with --fix: fixed) or wrapper
/// components found, 2 broken or damaged, 3 not readable by wrapcert, 66 an input that cannot
/// be read, 73 an output that cannot be written.
int run_check_keys_once(const CheckKeysCli& o, std::vector<std::string>* variants);

int run_check_keys(const CheckKeysCli& o) {
  std::vector<std::string> variants;
  int verdict = run_check_keys_once(o, &variants);
  // Each variant of the weights (model.fp16.safetensors) is a checkpoint of its own: checked
  // against the same reference, fixed in place with the rest.
  for (const auto& variant : variants) {
    std::cout << "\nvariant " << variant << ":\n";
    CheckKeysCli one = o;
    one.file = variant;
    one.variant = true;
    // Against a folder (another pipeline's component, another model folder): its own variant
    // of the same name where it has one.
    const auto name = std::filesystem::path(variant).filename();
    if (!o.against.empty() && names_a_folder(o.against) &&
        std::filesystem::is_regular_file(std::filesystem::path(o.against) / name)) {
      one.against = (std::filesystem::path(o.against) / name).string();
      one.variant = false;
    }
    if (o.fix_given) {
      std::cout << "not written by --fix, which writes one checkpoint: fix the variant by "
                   "naming it\n";
      one.fix_given = false;
      one.fix.clear();
    }
    if (one.variant && !(o.fixture.empty() && o.against.empty() && o.listing.empty())) {
      std::cout << "compared by names and shapes: a variant keeps a dtype of its own\n";
    }
    verdict = std::max(verdict, run_check_keys_once(one, nullptr));
  }
  return verdict;
}

int run_check_keys_once(const CheckKeysCli& o, std::vector<std::string>* variants) {
  const bool scan = o.fixture.empty() && o.against.empty() && o.listing.empty();
  const bool fixing = o.fix_given || o.in_place;
  if (o.fix_given && o.fix.empty()) {
    throw CLI::ValidationError("--fix", "needs the name of the file to write");
  }
  if (fixing && scan) {
    throw CLI::ValidationError("--fix", "needs a reference: --fixture, --against or --keys");
  }
  if (o.in_place && o.fix_given && o.fix != o.file) {
    throw CLI::ValidationError("--in-place", "writes over the checked file; drop --fix or name it");
  }
  if (names_a_folder(o.file)) {
    std::optional<wrapcert::Pipeline> pipeline;
    if (const int code = guarded(kExitNoInput, [&] { pipeline = wrapcert::read_pipeline(o.file); });
        code >= 0) {
      return code;
    }
    if (pipeline) return run_check_pipeline(o, *pipeline);
  }
  // The destination is checked before anything is read.
  if (o.fix_given && !names_a_folder(o.fix)) {
    if (const int code =
            guarded(kExitCannotWrite, [&] { wrapcert::check_destination(o.fix, {o.file}, false); });
        code >= 0) {
      return code;
    }
  }
  wrapcert::Checkpoint listing;
  if (const int code = guarded(kExitNoInput,
                               [&] {
                                 listing = wrapcert::read_checkpoint(o.file, {false, o.entry});
                               });
      code >= 0) {
    return code;
  }
  describe_checkpoint(o.file, listing);
  if (variants) *variants = listing.variants;

  std::vector<wrapcert::KeyInfo> expected;
  wrapcert::CheckKeysOptions options;
  options.compare_dtypes = !o.variant;
  if (!scan) {
    const int code = guarded(kExitNoInput, [&] {
      if (!o.fixture.empty()) {
        const auto config = wrapcert::fixtures::config_named(o.fixture);
        expected = wrapcert::key_infos(wrapcert::state_dict(
            wrapcert::fixtures::make_causal_lm(config, {c10::kMeta, config.checkpoint_dtype})));
      } else if (!o.against.empty()) {
        expected =
            wrapcert::key_infos(wrapcert::read_checkpoint(o.against, {/*data=*/false, ""}).state);
      } else {
        expected = wrapcert::read_key_listing(o.listing);
        options.compare_shapes = false;  // a listing has names only
      }
    });
    if (code >= 0) return code;
  }
  auto judge = [&](const std::vector<wrapcert::KeyInfo>& found) {
    return scan ? wrapcert::scan_keys(found)
                : wrapcert::check_keys(found, expected, wrapcert::Registry::global(), options);
  };
  auto exit_for = [](const wrapcert::KeyReport& r) {
    return r.status == wrapcert::KeyStatus::kClean    ? 0
           : r.status == wrapcert::KeyStatus::kBroken ? kExitBroken
                                                      : kExitFound;
  };
  const wrapcert::KeyReport report = judge(wrapcert::key_infos(listing));
  wrapcert::print(std::cout, report);
  int verdict = exit_for(report);
  // Every other state dict of the file (an EMA's) against the same reference.
  std::vector<wrapcert::EntryRenames> more;
  bool all_clean = report.status == wrapcert::KeyStatus::kClean;
  for (const auto& entry : listing.more_state_dicts) {
    wrapcert::Checkpoint other;
    if (const int code = guarded(kExitNoInput,
                                 [&] {
                                   other = wrapcert::read_checkpoint(o.file, {false, entry});
                                 });
        code >= 0) {
      return code;
    }
    std::cout << "\nstate dict in entry '" << entry << "' (" << other.state.size() << " keys)\n";
    const auto r = judge(wrapcert::key_infos(other));
    wrapcert::print(std::cout, r);
    verdict = std::max(verdict, exit_for(r));
    all_clean = all_clean && r.status == wrapcert::KeyStatus::kClean;
    more.push_back({entry, r.translation});
  }
  if (!fixing) return verdict;
  if (verdict == kExitBroken) {
    std::cout << "nothing written: a translation of the keys cannot make this checkpoint load\n";
    return verdict;
  }
  if (all_clean && o.in_place) {
    std::cout << "nothing to do: the keys are already the model's\n";
    return verdict;
  }
  if (!listing.partial.empty()) {
    std::cout << "nothing written: " << listing.partial << " was read (" << listing.files().back()
              << "); fix each rank's file on its own, naming it\n";
    return kExitUnsupported;
  }
  const std::string destination = o.in_place ? in_place_destination(o.file, listing) : o.fix;
  std::vector<std::string> outputs;
  const int code = guarded(kExitCannotWrite, [&] {
    outputs = wrapcert::planned_files(destination, listing);
    for (const auto& out : outputs) {
      wrapcert::check_destination(out, listing.files(), o.in_place);
    }
    wrapcert::CheckpointWriteOptions write;
    write.tie_copies = o.ties == "copy";
    wrapcert::write_fixed_checkpoint(destination, listing, report.translation, more, write);
  });
  if (code >= 0) return code;
  const bool safetensors =
      wrapcert::format_for(outputs.back()) == wrapcert::CheckpointFormat::kSafetensors;
  if (safetensors && !report.ties.empty()) {
    std::cout << (o.ties == "copy"
                      ? "ties in safetensors: each key stored as its own copy (--ties copy)\n"
                      : "ties in safetensors: stored once, the other keys left out as "
                        "Transformers saves them and listed in __metadata__ "
                        "(wrapcert.aliases); --ties copy stores copies\n");
  }
  if (all_clean) {
    std::cout << "nothing to fix: the keys are already the model's; written in the format "
                 "asked for\n";
  }
  for (const auto& out : outputs) std::cout << "wrote " << out << "\n";
  if (!listing.archive.empty() &&
      wrapcert::format_for(outputs.back()) == wrapcert::CheckpointFormat::kArchive) {
    std::cout << "kept every other member of the archive as it was (" << listing.not_read.size()
              << ")\n";
  } else if (!listing.archive.empty()) {
    std::cout << "the archive's other members (" << listing.not_read.size() << ") stay in "
              << o.file << "\n";
  }
  if (!listing.other_entries.empty()) {
    std::string entries;
    for (const auto& e : listing.other_entries) entries += " " + e;
    if (wrapcert::format_for(outputs.back()) != wrapcert::CheckpointFormat::kSafetensors) {
      std::cout << "kept the entries beside the state dict, unchanged:" << entries << "\n";
    } else {
      std::cout << "safetensors holds tensors alone: the entries beside the state dict ("
                << entries.substr(1) << ") stay in " << o.file << "\n";
    }
  }
  return verdict;
}

/// The seed thread, replicated: gemma-2b full size on meta, FSDPv2 on the root and every layer.
int run_seed(const FixtureOptions& o) {
  const auto config = wrapcert::fixtures::config_named(o.name);
  auto wrapped = wrapcert::fixtures::apply_fsdp_v2_recipe(build_fixture(config, o.device), config);
  const auto print = print_options(o.libtorch_style);
  std::cout << "A wrapped model (" << config.name << ", FSDPv2 on the root and every "
            << config.no_split_modules().front() << "):\n\n"
            << wrapcert::format_tree(wrapped, print) << "\n\n"
            << "When unwrapped using the legacy unwrap:\n\n"
            << wrapcert::format_tree(wrapcert::unwrap(wrapcert::BuiltinUnwrap::kLegacy, wrapped),
                                     print)
            << "\n\nWhen unwrapped using the reference unwrap:\n\n"
            << wrapcert::format_tree(wrapcert::unwrap_reference(wrapped), print) << "\n\n";
  const auto clean = wrapcert::keys(wrapcert::state_dict(build_fixture(config, "meta")));
  std::cout << "State-dict keys that still carry a wrapper slot (the model has " << clean.size()
            << " keys):\n";
  for (auto subject : wrapcert::all_subjects()) {
    // The duck-typed subject rewires the model it is given, so each subject gets a fresh one.
    auto fresh = wrapcert::fixtures::apply_fsdp_v2_recipe(build_fixture(config, o.device), config);
    const auto view = wrapcert::unwrap(subject, fresh);
    const auto left = wrapcert::wrapped_state(view);
    const bool exact = wrapcert::keys(view.state_dict()) == clean;
    std::cout << "  " << wrapcert::to_string(subject) << ": " << left.size() << " of "
              << view.state_dict().size() << (exact ? ", keys equal the model's" : "");
    if (!left.is_empty()) std::cout << ", e.g. " << left.begin()->key();
    std::cout << "\n";
  }
  return 0;
}

struct CertifyOptions {
  std::vector<std::string> wrappers;
  std::vector<std::string> fixtures = wrapcert::fixtures::default_certification_fixtures();
  std::string subject = "reference";
  int cases = 100;
  int max_size = 100;
  uint64_t seed = 0;
  std::string markdown;
  std::string json;
  std::string junit;
  bool quiet = false;
  std::vector<std::string> plugins;
  std::vector<std::string> dtypes;
  std::vector<std::string> properties;
  int timeout = wrapcert::certify::Options{}.timeout_seconds;
  bool in_process = false;
  // Across ranks.
  int world_size = 0;
  bool exec_ranks = false;
  int rank = -1;
  std::string master_addr;
  int master_port = 0;
};

/// This program's command line, for the ranks `--world-size` starts.
std::vector<std::string>& command_line() {
  static std::vector<std::string> words;
  return words;
}

/// googletest's rhythm on the console.
wrapcert::certify::Listener console_listener(bool quiet) {
  return [quiet](const wrapcert::certify::Entry& e, bool done) {
    if (quiet) return;
    const std::string name =
        e.kind + "." + e.property + " [" + wrapcert::certify::target_label(e) + "]";
    if (!done) {
      std::cout << "[ RUN      ] " << name << std::endl;
      return;
    }
    const char* tag = e.status == wrapcert::certify::Status::kFailed    ? "[  FAILED  ] "
                      : e.status == wrapcert::certify::Status::kSkipped ? "[  SKIPPED ] "
                                                                        : "[       OK ] ";
    if (e.status != wrapcert::certify::Status::kPassed) {
      std::cout << e.reason << (e.key.empty() ? "" : " at '" + e.key + "'") << "\n";
      if (!e.counterexample.empty()) std::cout << e.counterexample << "\n";
      if (!e.replay.empty()) std::cout << "replay: " << e.replay << "\n";
    } else if (!e.reason.empty()) {
      std::cout << "note: " << e.reason << "\n";  // a pass with something to say (refusals)
    }
    std::cout << tag << name << " (" << e.cases << " cases, " << static_cast<int>(e.seconds * 1000)
              << " ms)" << std::endl;
  };
}

int write_reports(const wrapcert::certify::Report& report, const std::string& markdown,
                  const std::string& json, const std::string& junit) {
  std::cout << "\n" << wrapcert::certify::to_summary(report);
  if (!markdown.empty()) {
    wrapcert::write_file_atomically(markdown, wrapcert::certify::to_markdown(report));
  }
  if (!json.empty()) wrapcert::write_file_atomically(json, wrapcert::certify::to_json(report));
  if (!junit.empty()) wrapcert::write_file_atomically(junit, wrapcert::certify::to_junit(report));
  return report.passed() ? 0 : kExitFound;
}

int run_certify(const CertifyOptions& o) {
  for (const auto& plugin : o.plugins) {
    std::cout << "plugin " << plugin << ":";
    for (const auto& name : wrapcert::load_plugin(plugin)) std::cout << " " << name;
    std::cout << std::endl;
  }
  for (const auto& kind : o.wrappers) {
    try {
      (void)wrapcert::Registry::global().resolve(kind);
    } catch (const wrapcert::Error&) {
      std::string known;
      for (const auto& name : wrapcert::Registry::global().names_with_modes()) known += " " + name;
      throw CLI::ValidationError("--wrappers", "unknown wrapper kind '" + kind + "' (known:" +
                                                   known + "; a plugin's kinds need --plugin)");
    }
  }
  wrapcert::certify::Options options;
  options.kinds = o.wrappers;
  options.models = wrapcert::fixtures::certification_models(o.fixtures);
  options.subject = wrapcert::subject_from_string(o.subject);
  options.cases = o.cases;
  options.max_size = o.max_size;
  options.seed = o.seed;
  options.timeout_seconds = o.timeout;
  options.isolate = !o.in_process;
  options.plugins = o.plugins;
  options.properties = o.properties;
  for (const auto& name : o.dtypes) {
    for (const auto dtype : wrapcert::gen::kAllDtypes) {
      if (name == wrapcert::gen::to_string(dtype)) options.dtypes.push_back(dtype);
    }
  }
  // Across ranks: as one rank (torchrun's variables, or --rank), or as the launcher of them.
  auto rendezvous = wrapcert::Rendezvous::from_env();
  if (o.rank >= 0) {
    if (!rendezvous) rendezvous.emplace();
    rendezvous->rank = o.rank;
  }
  // One rank: started by torchrun or by hand, executed or forked by the launcher below.
  auto as_rank = [&](std::optional<wrapcert::Rendezvous> rendezvous) -> int {
    if (!rendezvous) {
      throw wrapcert::Error(wrapcert::ErrorCode::kInvalidArgument, "",
                            "no rendezvous: RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT");
    }
    if (o.world_size > 0) {
      if (std::getenv("WORLD_SIZE") && o.world_size != rendezvous->world_size && o.rank < 0) {
        throw CLI::ValidationError("--world-size", std::to_string(o.world_size) +
                                                       " differs from WORLD_SIZE=" +
                                                       std::to_string(rendezvous->world_size));
      }
      rendezvous->world_size = o.world_size;
    }
    if (!o.master_addr.empty()) rendezvous->master_addr = o.master_addr;
    if (o.master_port > 0) rendezvous->master_port = o.master_port;
    const char* served = std::getenv("WRAPCERT_STORE_SERVED");
    const bool launched = served && std::string(served) == "1";
    // Under wrapcert's launcher, a rank waits longer in a collective than the launcher waits
    // for progress, so that the launcher names a hung rank before its peers give up on it.
    rendezvous->timeout = std::chrono::seconds(launched ? 2 * o.timeout + 30 : o.timeout);
    rendezvous->validate();
    const bool lead = rendezvous->rank == 0;
    const auto report =
        wrapcert::certify::run_rank(options, *rendezvous, console_listener(o.quiet || !lead));
    if (launched || !lead) return report.passed() ? 0 : kExitFound;
    return write_reports(report, o.markdown, o.json, o.junit);
  };
  if (rendezvous) return as_rank(std::move(rendezvous));
  if (o.world_size > 0) {
    wrapcert::certify::World world;
    world.size = o.world_size;
    world.timeout_seconds = o.timeout;
    world.command = command_line();
    for (const auto& word : world.command) {
      const bool plain =
          word.find_first_not_of(
              "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=,") ==
          std::string::npos;
      world.replay += (world.replay.empty() ? "" : " ") + (plain ? word : "'" + word + "'");
    }
    world.command[0] = std::filesystem::read_symlink("/proc/self/exe").string();
    if (options.seed == 0) {
      // One seed for every rank, printed for replay.
      options.seed = std::random_device{}() | 1u;
      world.command.push_back("--seed");
      world.command.push_back(std::to_string(options.seed));
      world.replay += " --seed " + std::to_string(options.seed);
    }
    if (!o.exec_ranks) world.here = [&] { return as_rank(wrapcert::Rendezvous::from_env()); };
    const auto report = wrapcert::certify::launch_ranks(options, world, console_listener(o.quiet));
    return write_reports(report, o.markdown, o.json, o.junit);
  }
  const auto report = wrapcert::certify::run(options, console_listener(o.quiet));
  return write_reports(report, o.markdown, o.json, o.junit);
}

struct CertifyPythonOptions {
  wrapcert::python::Options options;
  std::vector<std::string> slots;       // wrapper=slot
  std::vector<std::string> models;      // wrapper=kind
  std::vector<std::string> reductions;  // wrapper=mean|sum
  std::vector<std::string> owned;       // wrapper=name
  std::vector<std::string> aliases;     // wrapper=name
  std::vector<std::string> dtypes;
  bool no_fixtures = false;
  std::string markdown;
  std::string json;
  std::string junit;
  bool quiet = false;
};

/// `WRAPPER=VALUE` as an option gives it, both sides non-empty; else a usage error naming the
/// option and the form (`what` names VALUE).
std::pair<std::string, std::string> wrapper_pair(const std::string& text, const char* option,
                                                 const char* what) {
  const auto eq = text.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == text.size()) {
    throw CLI::ValidationError(option, "'" + text + "' is not WRAPPER=" + what);
  }
  return {text.substr(0, eq), text.substr(eq + 1)};
}

int run_certify_python(CertifyPythonOptions& o) {
  for (const auto& s : o.slots) {
    auto [wrapper, slot] = wrapper_pair(s, "--slot", "SLOT");
    o.options.slots[wrapper] = slot;
  }
  for (const auto& m : o.models) {
    auto [wrapper, kind] = wrapper_pair(m, "--models", "KIND");
    o.options.models[wrapper] = kind;
  }
  for (const auto& m : o.reductions) {
    const auto eq = m.find('=');
    const auto how = eq == std::string::npos ? std::string() : m.substr(eq + 1);
    if (eq == std::string::npos || eq == 0 || (how != "mean" && how != "sum")) {
      throw CLI::ValidationError("--reduction", "'" + m + "' is not WRAPPER=mean or WRAPPER=sum");
    }
    o.options.reductions[m.substr(0, eq)] = how;
  }
  for (const auto& m : o.owned) {
    auto [wrapper, name] = wrapper_pair(m, "--owned-state", "NAME");
    o.options.owned_state[wrapper].push_back(name);
  }
  for (const auto& m : o.aliases) {
    auto [wrapper, name] = wrapper_pair(m, "--alias", "NAME");
    o.options.aliases[wrapper].push_back(name);
  }
  for (const auto& name : o.dtypes) {
    for (const auto dtype : wrapcert::gen::kAllDtypes) {
      if (name == wrapcert::gen::to_string(dtype)) o.options.dtypes.push_back(dtype);
    }
  }
  o.options.fixtures = !o.no_fixtures;
  wrapcert::python::Stats stats;
  const auto report =
      wrapcert::python::certify_python(o.options, console_listener(o.quiet), &stats);
  const int code = write_reports(report, o.markdown, o.json, o.junit);
  auto rate = [](int cases, double seconds) {
    return seconds > 0 ? std::to_string(static_cast<int>(cases / seconds)) + "/s" : "-";
  };
  std::cout << "\nworker (PyTorch " << stats.torch_version << "): " << stats.structural_cases
            << " structural cases (" << rate(stats.structural_cases, stats.structural_seconds)
            << "), " << stats.numeric_cases << " P4 cases ("
            << rate(stats.numeric_cases, stats.numeric_seconds) << "), " << stats.training_cases
            << " P17 cases (" << rate(stats.training_cases, stats.training_seconds) << "), "
            << stats.fixture_cases << " fixture cases ("
            << static_cast<int>(stats.fixture_seconds * 1000) << " ms), " << stats.worker_starts
            << (stats.worker_starts == 1 ? " process" : " processes");
  if (stats.preloaded_starts > 0) {
    std::cout << " (" << stats.preloaded_starts << " forked from a preloaded interpreter)";
  }
  std::cout << "\n";
  return code;
}

int run_check_dump(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw wrapcert::Error(wrapcert::ErrorCode::kMalformedInput, "", "cannot read " + file);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  bool passed = true;
  for (const auto& v : wrapcert::bridge::check_tree_dump(text)) {
    std::cout << (v.skipped ? "skip " : v.passed ? "pass " : "FAIL ") << v.property;
    if (!v.passed || v.skipped) std::cout << ": " << v.reason;
    if (!v.key.empty()) std::cout << " at '" << v.key << "'";
    std::cout << "\n";
    passed = passed && v.passed;
  }
  return passed ? 0 : kExitFound;
}

}  // namespace

/// The tool's command line (in a process of its own, or forked by `serve-forks`).
int run_command_line(int argc, char** argv) {
  command_line().assign(argv, argv + argc);
  CLI::App app{"wrapcert: verify that unwrapping wrapped module trees gives the model back"};
  app.require_subcommand(1);

  DemoOptions demo;
  auto* demo_cmd = app.add_subcommand(
      "demo", "Wrap a small model as the seed did (root + every layer) and compare unwraps");
  demo_cmd->add_option("--layers", demo.layers, "decoder layers")->check(CLI::Range(1, 1000));
  demo_cmd->add_option("--hidden", demo.hidden, "hidden size")->check(CLI::Range(1, 4096));
  demo_cmd->add_flag("--libtorch-style", demo.libtorch_style, "print as LibTorch's operator<<");
  demo_cmd->add_flag("--no-compress", demo.no_compress,
                     "print every ModuleList element (PyTorch < 2.0 style)");
  demo_cmd->callback([&] { finish(run_demo(demo)); });

  std::vector<std::string> fixture_names;
  for (const auto& config : wrapcert::fixtures::all_configs()) fixture_names.push_back(config.name);

  FixtureOptions fixture;
  auto* fixture_cmd = app.add_subcommand("fixture", "Print a model fixture's tree or keys");
  fixture_cmd->add_option("name", fixture.name, "fixture")->check(CLI::IsMember(fixture_names));
  fixture_cmd->add_option("--device", fixture.device, "meta (no weight memory) or cpu")
      ->check(CLI::IsMember({"meta", "cpu"}));
  fixture_cmd->add_flag("--keys", fixture.keys, "list keys, shapes, dtypes and storage ids");
  fixture_cmd->add_flag("--wrapped", fixture.wrapped, "apply the seed's FSDPv2 recipe first");
  fixture_cmd->add_flag("--libtorch-style", fixture.libtorch_style,
                        "print as LibTorch's operator<<");
  fixture_cmd->add_option("--save", fixture.save, "write its state dict as safetensors");
  fixture_cmd->callback([&] { finish(run_fixture(fixture)); });

  CheckKeysCli check;
  auto* check_cmd = app.add_subcommand(
      "check-keys",
      "Compare a checkpoint's keys with a model's, or scan them for wrapper components; exit 0 "
      "clean, 1 fixable or components found, 2 broken or damaged, 3 not readable by wrapcert, "
      "66 unreadable input, 73 unwritable output");
  check_cmd
      ->add_option("file", check.file,
                   "a checkpoint: safetensors or torch.save (zip or legacy, plain or nested), "
                   "an index (*.index.json) or a folder of shards")
      ->required();
  auto* against_fixture = check_cmd->add_option("--fixture", check.fixture, "a fixture's keys")
                              ->check(CLI::IsMember(fixture_names));
  auto* against_file = check_cmd->add_option("--against", check.against, "another checkpoint");
  auto* against_listing =
      check_cmd->add_option("--keys", check.listing, "a key listing file (one key per line)");
  against_fixture->excludes(against_file)->excludes(against_listing);
  against_file->excludes(against_listing);
  check_cmd->add_option("--entry", check.entry,
                        "where a nested torch.save checkpoint keeps the state dict (a.b); "
                        "default: state_dict, model, module or model_state_dict");
  auto* fix_opt = check_cmd->add_option(
      "--fix", check.fix,
      "write the translated checkpoint here, atomically: *.safetensors, or *.pt/*.pth/*.bin/*.ckpt "
      "for torch.save; a sharded one to an *.index.json or a folder");
  check_cmd
      ->add_option("--ties", check.ties,
                   "tied keys in safetensors output: once (stored once, the others listed, as "
                   "Transformers leaves them out) or copy (each its own copy)")
      ->check(CLI::IsMember({"once", "copy"}))
      ->capture_default_str();
  check_cmd->add_flag("--in-place", check.in_place,
                      "write the translated checkpoint over the checked one (atomically)");
  check_cmd->callback([&] {
    check.fix_given = fix_opt->count() > 0;
    finish(run_check_keys(check));
  });

  FixtureOptions seed;
  auto* seed_cmd = app.add_subcommand(
      "seed", "The seed thread replicated: wrap gemma-2b as FSDPv2 did and compare the unwraps");
  seed_cmd->add_option("--fixture", seed.name, "fixture")->check(CLI::IsMember(fixture_names));
  seed_cmd->add_flag("--libtorch-style", seed.libtorch_style, "print as LibTorch's operator<<");
  seed_cmd->callback([&] { finish(run_seed(seed)); });

  CertifyOptions certify;
  auto* certify_cmd = app.add_subcommand(
      "certify", "Certify wrapper kinds against P1-P17 on generated trees and the fixtures");
  std::string builtin_names;
  for (const auto& name : wrapcert::Registry::global().names_with_modes()) {
    builtin_names += (builtin_names.empty() ? "" : ", ") + name;
  }
  certify_cmd->add_option(
      "--wrappers", certify.wrappers,
      "wrapper kinds (default: all; built in: " + builtin_names + "; more from --plugin)");
  certify_cmd->add_option("--plugin", certify.plugins,
                          "a shared library of wrapper kinds (WRAPCERT_PLUGIN in "
                          "<wrapcert/plugin.h>) to load first; repeatable");
  certify_cmd->add_option("--fixtures", certify.fixtures, "fixtures")
      ->check(CLI::IsMember(fixture_names));
  certify_cmd
      ->add_option("--dtypes", certify.dtypes,
                   "dtypes P4, P13 and P14 run in, each a row (default: all: float64, float32, "
                   "bfloat16, float16); comma-separated or repeated")
      ->delimiter(',')
      ->check(CLI::IsMember({"float64", "float32", "bfloat16", "float16"}));
  certify_cmd
      ->add_option("--properties", certify.properties,
                   "properties to run, P1 to P16 (default: all); comma-separated or repeated")
      ->delimiter(',');
  certify_cmd->add_option("--subject", certify.subject, "unwrap subject")
      ->check(CLI::IsMember({"reference", "legacy", "duck_typed"}));
  certify_cmd->add_option("--cases", certify.cases, "generated cases per property")
      ->check(CLI::Range(1, 1000000));
  certify_cmd->add_option("--max-size", certify.max_size, "rapidcheck size bound")
      ->check(CLI::Range(1, 10000));
  certify_cmd->add_option("--seed", certify.seed, "seed (0: random, printed for replay)");
  certify_cmd->add_option("--markdown", certify.markdown, "write a Markdown report");
  certify_cmd->add_option("--json", certify.json, "write a JSON report");
  certify_cmd->add_option("--junit", certify.junit, "write a JUnit XML report");
  certify_cmd->add_flag("--quiet", certify.quiet, "print only the summary table");
  certify_cmd
      ->add_option("--timeout", certify.timeout,
                   "seconds one check may take before it is stopped as hung")
      ->check(CLI::Range(1, 86400));
  certify_cmd->add_flag("--in-process", certify.in_process,
                        "run the checks in this process (no crash or hang isolation; for "
                        "debuggers)");
  certify_cmd
      ->add_option("--world-size", certify.world_size,
                   "certify across this many ranks (torch.distributed's Gloo): start them here, "
                   "or, with --rank or torchrun's RANK, be one of them")
      ->check(CLI::Range(1, 1024));
  certify_cmd->add_flag("--exec-ranks", certify.exec_ranks,
                        "with --world-size: start each rank by running this command line again, "
                        "as torchrun does (default: a fork of this process, which has loaded "
                        "LibTorch and the plugins already)");
  certify_cmd
      ->add_option("--rank", certify.rank,
                   "this process's rank in a run across ranks (default: RANK, SLURM_PROCID)")
      ->check(CLI::Range(0, 1023));
  certify_cmd->add_option("--master-addr", certify.master_addr,
                          "where rank 0 serves the store (default: MASTER_ADDR, 127.0.0.1)");
  certify_cmd
      ->add_option("--master-port", certify.master_port,
                   "the store's port (default: MASTER_PORT, 29500)")
      ->check(CLI::Range(1, 65535));
  certify_cmd->callback([&] { finish(run_certify(certify)); });

  CertifyPythonOptions py;
  auto* py_cmd = app.add_subcommand(
      "certify-python",
      "Certify real Python wrappers, or a Python unwrap function, on generated trees built in "
      "PyTorch by a persistent worker ($WRAPCERT_PYTHON, else /usr/bin/python3)");
  py_cmd->option_defaults()->always_capture_default();
  py_cmd
      ->add_option("--wrapper", py.options.wrappers,
                   "a wrapper: package.module:callable (through PYTHONPATH) or DataParallel, "
                   "DistributedDataParallel, checkpoint_wrapper, checkpoint_wrapper[reentrant], "
                   "SpmdFullyShardedDataParallel; repeatable")
      ->required();
  py_cmd->add_option("--slot", py.slots,
                     "WRAPPER=SLOT: the child a wrapper keeps the module in, where it is not "
                     "found as the child that is the module given; repeatable");
  py_cmd->add_option("--models", py.models,
                     "WRAPPER=KIND: the wrapcert kind that models a wrapper; its saved keys must "
                     "be the real wrapper's on every tree (row 'C++ agreement'); repeatable");
  py_cmd
      ->add_option("--world-size", py.options.world_size,
                   "run the worker as this many torch.distributed ranks on gloo (every case on "
                   "every rank, each on its slice of the batch; DistributedDataParallel with a "
                   "real all-reduce)")
      ->check(CLI::Range(1, 64));
  py_cmd->add_option("--reduction", py.reductions,
                     "WRAPPER=mean|sum: how a wrapper reduces gradients across ranks (P4 at "
                     "--world-size above 1; DistributedDataParallel: mean); repeatable");
  py_cmd->add_option("--alias", py.aliases,
                     "WRAPPER=NAME: an attribute of the wrapper that must reach the very module "
                     "in its slot (P16); repeatable");
  py_cmd->add_option("--release", py.options.release,
                     "a permanent unwrap to certify (package.module:callable, wrapped model -> "
                     "model; P14); default: P14 skipped");
  py_cmd->add_option("--owned-state", py.owned,
                     "WRAPPER=NAME: a tensor or module a wrapper holds besides its slot, "
                     "declared as its own (P15; P8 does not translate it); repeatable");
  py_cmd->add_option("--unwrap", py.options.unwrap,
                     "the unwrap function to certify (package.module:callable, model -> module); "
                     "default: wrapcert's reference unwrap ported to Python");
  py_cmd->add_option("--cases", py.options.cases, "generated cases per property")
      ->check(CLI::Range(1, 1000000));
  py_cmd->add_option("--max-size", py.options.max_size, "rapidcheck size bound")
      ->check(CLI::Range(1, 10000));
  py_cmd->add_option("--seed", py.options.seed, "seed (0: random, printed for replay)");
  py_cmd
      ->add_option("--dtypes", py.dtypes,
                   "dtypes the rows that run the model (P4, P14, P17) run in, each a row "
                   "(default: float64, float32, bfloat16); comma-separated or repeated")
      ->delimiter(',')
      ->check(CLI::IsMember({"float64", "float32", "bfloat16"}));
  py_cmd
      ->add_option("--tolerance", py.options.tolerance,
                   "P4 and P17: largest difference allowed in outputs and gradients (0: bit "
                   "for bit)")
      ->check(CLI::NonNegativeNumber);
  py_cmd
      ->add_option("--timeout", py.options.timeout_seconds,
                   "seconds one case may take before the worker is stopped as hung (from the "
                   "case's start; starting the interpreter has --start-timeout)")
      ->check(CLI::Range(0.1, 86400.0));
  py_cmd
      ->add_option("--start-timeout", py.options.start_timeout_seconds,
                   "seconds a worker may take to start (the interpreter, importing torch)")
      ->check(CLI::Range(0.1, 86400.0));
  py_cmd->add_flag("--no-fixtures", py.no_fixtures,
                   "leave out the fixture rows (the tiny Gemma and Mistral built in Python)");
  py_cmd->add_option("--repro", py.options.repro,
                     "write a standalone Python script reproducing the first failure here");
  py_cmd->add_option("--markdown", py.markdown, "write a Markdown report");
  py_cmd->add_option("--json", py.json, "write a JSON report");
  py_cmd->add_option("--junit", py.junit, "write a JUnit XML report");
  py_cmd->add_flag("--quiet", py.quiet, "print only the summary table");
  py_cmd->callback([&] { finish(run_certify_python(py)); });

  std::string dump_file;
  auto* dump_cmd = app.add_subcommand(
      "check-dump",
      "Check a module tree dumped from PyTorch by tools/torch_tree_dump.py (P1, P3, P8, and P9 "
      "for a tree without wrappers); exit 0 passed, 1 failed, 2 malformed");
  dump_cmd->add_option("file", dump_file, "the dump (JSON)")->required();
  dump_cmd->callback([&] { finish(run_check_dump(dump_file)); });

  bool hardware_json = false;
  auto* hardware_cmd = app.add_subcommand("hardware", "Show the CPU, CUDA devices and TPUs found");
  hardware_cmd->add_flag("--json", hardware_json, "print JSON");
  hardware_cmd->callback([&] {
    const auto report = wrapcert::hardware::detect();
    std::cout << (hardware_json ? wrapcert::hardware::to_json(report)
                                : wrapcert::hardware::to_text(report));
    finish(0);
  });

  app.set_version_flag("--version", std::string("wrapcert ") + WRAPCERT_VERSION);
  app.footer(
      "Exit codes: 0 clean or passed; 1 fixable, wrapper components found, or certification "
      "failed; 2 broken checkpoint (keys that do not load) or a damaged file; 3 a valid file "
      "that wrapcert does not read (the message says how to convert it); 64 usage error; 66 an "
      "input that cannot be read (missing, not a regular file, an empty key listing); 73 an "
      "output that cannot be written (refused by type, read as input, no room).");
  if (argc > 1 && argv[1][0] != '-') {
    std::vector<std::string> names;
    for (const auto* sub : app.get_subcommands({})) names.push_back(sub->get_name());
    if (std::find(names.begin(), names.end(), argv[1]) == names.end()) {
      std::string list;
      for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
      std::cerr << "wrapcert: unknown command '" << argv[1] << "' (commands: " << list << ")\n";
      return kExitUsage;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);  // --help, --version
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return kExitUsage;
  } catch (const wrapcert::Error& e) {
    std::cerr << e.what() << "\n";
    return exit_code_for(e, kExitBroken);
  } catch (const std::exception& e) {
    const std::string what = e.what();
    std::cerr << "wrapcert: " << what.substr(0, what.find('\n')) << "\n";
    return kExitBroken;
  }
  return 0;
}

int main(int argc, char** argv) {
  // Not a subcommand of the parser: the children it forks parse their own command lines.
  if (argc >= 2 && std::string(argv[1]) == "serve-forks") {
    if (argc != 3) {
      std::cerr << "usage: wrapcert serve-forks SOCKET\n";
      return kExitUsage;
    }
    return wrapcert::cli::serve_forks(argv[2], &run_command_line);
  }
  return run_command_line(argc, argv);
}
