#include <wrapcert/certify/detail/training.h>
#include <wrapcert/certify/property_table.h>

#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

#include <set>

namespace wrapcert::detail {

std::vector<torch::Tensor> unique_parameters(const ModulePtr& root) {
  std::vector<torch::Tensor> out;
  std::set<const void*> seen;
  for (const auto& p : root->parameters(/*recurse=*/true)) {
    if (p.defined() && seen.insert(p.unsafeGetTensorImpl()).second) out.push_back(p);
  }
  return out;
}

Trainer::Trainer(gen::Optimizer kind, std::vector<torch::Tensor> params)
    : params_(std::move(params)) {
  std::vector<torch::Tensor> stepped;
  for (const auto& p : params_) {
    const bool master = p.scalar_type() != torch::kDouble;
    masters_.push_back(master ? p.detach().to(torch::kDouble).requires_grad_(p.requires_grad())
                              : torch::Tensor());
    stepped.push_back(master ? masters_.back() : p);
  }
  if (kind == gen::Optimizer::kAdam) {
    optimizer_ = std::make_unique<torch::optim::Adam>(
        stepped, torch::optim::AdamOptions(props::kTrainingLearningRate));
  } else {
    optimizer_ = std::make_unique<torch::optim::SGD>(
        stepped,
        torch::optim::SGDOptions(props::kTrainingLearningRate).momentum(props::kTrainingMomentum));
  }
}

Trainer::~Trainer() = default;

void Trainer::step() {
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!masters_[i].defined()) continue;
    const auto& g = params_[i].grad();
    masters_[i].mutable_grad() = g.defined() ? g.to(torch::kDouble) : torch::Tensor();
  }
  optimizer_->step();
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (masters_[i].defined()) params_[i].copy_(masters_[i]);
  }
}

std::optional<std::pair<std::string, std::string>> mode_difference(const ModulePtr& root,
                                                                   bool training) {
  for (const auto& item : root->named_modules()) {
    if (item.value()->is_training() == training) continue;
    return std::make_pair(item.key(), std::string(training ? "in eval mode" : "in training mode") +
                                          ", the model " +
                                          (training ? "in training mode" : "in eval mode"));
  }
  return std::nullopt;
}

bool finite(const torch::Tensor& t) {
  return !t.defined() || t.isfinite().all().item<bool>();
}

}  // namespace wrapcert::detail
