// wrapcert: the command-line tool. `wrapcert demo` shows the seed's bug and its fix.

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

  try {
    CLI11_PARSE(app, argc, argv);
  } catch (const wrapcert::Error& e) {
    std::cerr << e.what() << "\n";
    return 2;
  }
  return 0;
}
