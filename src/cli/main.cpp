// wrapcert: the command-line tool. `wrapcert demo` shows the seed's bug and its fix.

#include <wrapcert/fixtures/causal_lm.h>
#include <wrapcert/fixtures/demo.h>
#include <wrapcert/wrapcert.h>

#include <CLI/CLI.hpp>

#include <iostream>

namespace {

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
  wrapcert::PrintOptions print;
  print.style = o.libtorch_style ? wrapcert::PrintStyle::kLibTorch : wrapcert::PrintStyle::kPython;
  print.compress_repeated = !o.no_compress;

  auto wrapped = wrapped_demo(o);
  const auto total = wrapcert::unwrap_reference(wrapped).state_dict().size();
  std::cout << "A wrapped model (root and every decoder layer):\n\n"
            << wrapcert::format_tree(wrapped, print) << "\n\n";
  std::cout << "After the legacy unwrap (root chain only):\n\n"
            << wrapcert::format_tree(wrapcert::unwrap(wrapcert::Subject::kLegacy, wrapped), print)
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
  auto model = build_fixture(config, o.device);
  if (o.wrapped) model = wrapcert::fixtures::apply_seed_recipe(model, config);
  if (o.keys) {
    std::cout << wrapcert::format_keys(wrapcert::state_dict(model));
  } else {
    std::cout << wrapcert::format_tree(model, print_options(o.libtorch_style)) << "\n";
  }
  return 0;
}

/// The seed thread, replicated: gemma-2b full size on meta, FSDPv2 on the root and every layer.
int run_seed(const FixtureOptions& o) {
  const auto config = wrapcert::fixtures::config_named(o.name);
  auto wrapped = wrapcert::fixtures::apply_seed_recipe(build_fixture(config, o.device), config);
  const auto print = print_options(o.libtorch_style);
  std::cout << "A wrapped model (" << config.name << ", FSDPv2 on the root and every "
            << config.no_split_modules().front() << "):\n\n"
            << wrapcert::format_tree(wrapped, print) << "\n\n"
            << "When unwrapped using the legacy unwrap:\n\n"
            << wrapcert::format_tree(wrapcert::unwrap(wrapcert::Subject::kLegacy, wrapped), print)
            << "\n\nWhen unwrapped using the reference unwrap:\n\n"
            << wrapcert::format_tree(wrapcert::unwrap_reference(wrapped), print) << "\n\n";
  const auto clean = wrapcert::keys(wrapcert::state_dict(build_fixture(config, "meta")));
  std::cout << "State-dict keys that still carry a wrapper slot (the model has " << clean.size()
            << " keys):\n";
  for (auto subject : wrapcert::all_subjects()) {
    // The duck-typed subject rewires the model it is given, so each subject gets a fresh one.
    auto fresh = wrapcert::fixtures::apply_seed_recipe(build_fixture(config, o.device), config);
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

}  // namespace

int main(int argc, char** argv) {
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
  demo_cmd->callback([&] { std::exit(run_demo(demo)); });

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
  fixture_cmd->callback([&] { std::exit(run_fixture(fixture)); });

  FixtureOptions seed;
  auto* seed_cmd = app.add_subcommand(
      "seed", "The seed thread replicated: wrap gemma-2b as FSDPv2 did and compare the unwraps");
  seed_cmd->add_option("--fixture", seed.name, "fixture")->check(CLI::IsMember(fixture_names));
  seed_cmd->add_flag("--libtorch-style", seed.libtorch_style, "print as LibTorch's operator<<");
  seed_cmd->callback([&] { std::exit(run_seed(seed)); });

  try {
    CLI11_PARSE(app, argc, argv);
  } catch (const wrapcert::Error& e) {
    std::cerr << e.what() << "\n";
    return 2;
  }
  return 0;
}
