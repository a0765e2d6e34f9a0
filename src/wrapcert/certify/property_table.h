#pragma once
/// The one table of wrapcert's properties: ids, what each checks, how its cases are drawn, how
/// results are compared, and where it runs. The single-process run (`generated_properties()`),
/// the run across ranks and `certify-python` take their rows from it, and the training loop's
/// steps are defined here once for all three (the Python worker is sent them with each case).
///
///   for (const auto& p : wrapcert::props::property_table()) {
///     std::cout << p.name << ": " << p.checks << (p.python.empty() ? "" : " [Python]") << "\n";
///   }

#include <wrapcert/gen/generators.h>
#include <wrapcert/gen/spec.h>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace wrapcert::props {

struct PropertyInfo {
  std::string id;      ///< "P17"
  std::string name;    ///< "P17 training": the name of its rows
  std::string checks;  ///< what it checks, in one line
  /// How its cases are drawn, in words, and as a change to the generator's options (P7: wrappers
  /// at the root only; P9: none).
  std::string draws;
  std::function<void(gen::GenOptions&)> adjust;
  /// Runs the model: a row per dtype, each case in training or eval mode (drawn).
  bool numeric = false;
  /// Trains the model (the training loop): its rows say which optimizers the cases drew.
  bool trains = false;
  /// How results are compared, in words (bit for bit, or the tolerance and why).
  std::string compares;
  /// Its row across ranks (`P4 backward across ranks`); empty: not run across ranks, and
  /// `not_across_ranks` says why.
  std::string ranks;
  std::string not_across_ranks;
  /// Its row in `certify-python` (the property's name); empty: not run there, and
  /// `not_in_python` says why.
  std::string python;
  std::string not_in_python;
};

/// P1-P17, in order.
const std::vector<PropertyInfo>& property_table();
/// The entry with this id ("P4") or name ("P4 backward"); throws `Error` for another.
const PropertyInfo& property_info(std::string_view id_or_name);

/// One step of the training loop (P17), as both models take it.
struct TrainingStep {
  enum class What {
    kTrain,       ///< forward, backward and an optimizer step
    kNoGrad,      ///< a call under `torch.no_grad()`
    kSwitchMode,  ///< `eval()` (or `train()`) through the wrappers, then a call
  };
  What what;
  int64_t batch;  ///< examples in the call
};
/// The training loop's steps on a tree that draws `batch` examples: a step on the batch, a
/// no-grad call, the mode switched and a call, a step on one example, the mode switched back
/// and a call, a step on the batch.
std::vector<TrainingStep> training_steps(int64_t batch);
/// "train", "no_grad", "switch_mode": how the Python worker is sent each step.
const char* to_string(TrainingStep::What what);
/// What those steps hold, for the reports.
inline constexpr int kTrainingOptimizerSteps = 3;
inline constexpr int kTrainingNoGradCalls = 1;
inline constexpr int kTrainingModeSwitches = 2;
/// The optimizers' settings, in both drivers: SGD with momentum, or Adam, at this rate.
inline constexpr double kTrainingLearningRate = 1e-2;
inline constexpr double kTrainingMomentum = 0.9;
/// Seeds the training loop draws its inputs from: step i's input is `kTrainingInputSeed + i`,
/// the probe after the save `kTrainingProbeSeed`; the fresh model loaded from the save is built
/// from `kTrainingFreshSeed` (other values than the trained one's).
inline constexpr uint64_t kTrainingInputSeed = 100;
inline constexpr uint64_t kTrainingProbeSeed = 200;
inline constexpr uint64_t kTrainingFreshSeed = 99;

}  // namespace wrapcert::props
