#include <wrapcert/certify/property_table.h>
#include <wrapcert/error.h>

namespace wrapcert::props {

const std::vector<PropertyInfo>& property_table() {
  static const std::vector<PropertyInfo> table = [] {
    const std::string as_drawn =
        "generated trees: widths 1-8, batches 1-5, frozen, mode-dependent and cloneable leaves, "
        "ties and shared modules, wrapper stacks at every node";
    const std::string exact = "bit for bit";
    auto any = [](gen::GenOptions&) {};
    auto entry = [&](std::string id, std::string name, std::string checks, std::string compares) {
      PropertyInfo p;
      p.id = std::move(id);
      p.name = std::move(name);
      p.checks = std::move(checks);
      p.draws = as_drawn;
      p.adjust = any;
      p.compares = std::move(compares);
      p.python = p.name;
      p.not_across_ranks = "judged on one process: nothing in it differs between ranks";
      return p;
    };
    std::vector<PropertyInfo> t{
        entry("P1", "P1 keys", "the unwrapped keys are the model's, in order",
              "names, order and count"),
        entry("P2", "P2 identity",
              "every tensor is the model's own, with its requires_grad; every module in the "
              "model's mode",
              "tensor objects and storages"),
        entry("P3", "P3 ties", "keys share tensors as before", "groups of keys per tensor"),
        entry("P4", "P4 backward", "outputs and gradients through the wrappers and without them",
              "bit for bit (a shared module or a tie: within 4(k+2) epsilons, sums in another "
              "order; across ranks a reduced gradient within 2(N+1) epsilons)"),
        entry("P5", "P5 non-mutation", "the wrapped model is left as it was",
              "keys, tensors and module paths"),
        entry("P6", "P6 laws", "u(M) is M; u(u(x)) is u(x)", "keys and tensors"),
        entry("P7", "P7 legacy", "agrees with the legacy unwrap on a chain at the root", "keys"),
        entry("P8", "P8 translation", "wrapped keys translate one to one to the clean keys",
              "keys and tensors"),
        entry("P9", "P9 no false positives", "user modules named like slots are left alone",
              "keys and the model object"),
        entry("P10", "P10 round trip",
              "what it saves loads into a fresh model, and a fresh wrapped one", exact),
        entry("P11", "P11 graph safety", "a cycle is an error, not a hang",
              "module objects per path"),
        entry("P12", "P12 order", "every order of a wrapper stack unwraps alike", "keys"),
        entry("P13", "P13 values", "shapes, dtypes and values are the model's", exact),
        entry("P14", "P14 release", "releasing every wrapper gives back the model itself", exact),
        entry("P15", "P15 owned state", "wrappers hold only declared state, none of it the model's",
              "names"),
        entry("P16", "P16 aliases", "every declared alias reaches the module in the slot",
              "module objects"),
        entry("P17", "P17 training",
              "trains, switches mode and runs under no_grad as without the wrappers; the "
              "trained model saves and loads",
              "bit for bit below float64 on float64 master weights (a shared module or a tie: "
              "the gradients' tolerance, growing per step; a flat float64 parameter: 4k "
              "epsilons after k steps)"),
    };
    auto& p4 = t[3];
    auto& p7 = t[6];
    auto& p9 = t[8];
    auto& p12 = t[11];
    auto& p13 = t[12];
    auto& p14 = t[13];
    auto& p17 = t[16];
    p4.numeric = p13.numeric = p14.numeric = p17.numeric = true;
    p17.trains = true;
    p7.draws = "wrappers in a chain at the root only (where the legacy unwrap is right)";
    p7.adjust = [](gen::GenOptions& o) { o.root_chain_only = true; };
    p9.draws = "trees without wrappers, children named like slots";
    p9.adjust = [](gen::GenOptions& o) {
      o.wrappers = false;
      o.adversarial_names = true;
    };
    // Across ranks: what a rank may see differently.
    t[0].ranks = "P1 keys across ranks";
    t[3].ranks = "P4 backward across ranks";
    t[9].ranks = "P10 round trip across ranks";
    p13.ranks = "P13 values across ranks";
    p14.ranks = "P14 release across ranks";
    p17.ranks = "P17 training across ranks";
    for (auto& p : t) {
      if (!p.ranks.empty()) p.not_across_ranks.clear();
    }
    // In certify-python: the worker runs real Python wrappers around trees built in PyTorch.
    p7.python.clear();
    p7.not_in_python = "the legacy unwrap it compares with is wrapcert's own C++";
    p12.python.clear();
    p12.not_in_python =
        "shuffles stacks of wrapcert kinds; a Python run's stacks are of the wrappers given, "
        "in the order given";
    return t;
  }();
  return table;
}

const PropertyInfo& property_info(std::string_view id_or_name) {
  for (const auto& p : property_table()) {
    if (p.id == id_or_name || p.name == id_or_name) return p;
  }
  throw Error(ErrorCode::kInvalidArgument, std::string(id_or_name),
              "no property is called '" + std::string(id_or_name) + "'");
}

std::vector<TrainingStep> training_steps(int64_t batch) {
  using What = TrainingStep::What;
  return {{What::kTrain, batch}, {What::kNoGrad, 1},     {What::kSwitchMode, batch},
          {What::kTrain, 1},     {What::kSwitchMode, 1}, {What::kTrain, batch}};
}

const char* to_string(TrainingStep::What what) {
  switch (what) {
    case TrainingStep::What::kTrain:
      return "train";
    case TrainingStep::What::kNoGrad:
      return "no_grad";
    case TrainingStep::What::kSwitchMode:
      return "switch_mode";
  }
  return "train";
}

}  // namespace wrapcert::props
