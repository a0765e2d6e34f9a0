#include <wrapcert/certify/certify.h>

#include <torch/version.h>
#include <nlohmann/json.hpp>
#include <pugixml.hpp>

#include <algorithm>
#include <iomanip>
#include <map>
#include <set>
#include <sstream>

#ifndef WRAPCERT_VERSION
#define WRAPCERT_VERSION "unknown"
#endif

namespace wrapcert::certify {
namespace {

/// Markdown table cells hold one line without pipes.
std::string cell(std::string text) {
  for (auto& c : text) {
    if (c == '|') c = '/';
    if (c == '\n') c = ' ';
  }
  return text;
}

/// Text as XML 1.0 can hold it: a character it forbids (control characters but tab, newline and
/// carriage return; U+FFFE and U+FFFF) and every byte that is not part of valid UTF-8 become
/// U+FFFD. Reasons and counterexamples carry what the code under certification printed, a
/// Python traceback or a worker's stray bytes among it. (pugixml escapes markup, not these.)
std::string xml_text(const std::string& text) {
  static const std::string kReplacement = "\xEF\xBF\xBD";
  std::string out;
  out.reserve(text.size());
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = s[i];
    if (c < 0x80) {
      const bool allowed = c >= 0x20 || c == '\t' || c == '\n' || c == '\r';
      out += allowed ? std::string(1, static_cast<char>(c)) : kReplacement;
      ++i;
      continue;
    }
    // The length of a well-formed sequence starting with `c`, and its first continuation's range
    // (Unicode's table 3-7: no overlong forms, no surrogates, nothing above U+10FFFF).
    size_t length = 0;
    unsigned char low = 0x80, high = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
      length = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      length = 3;
      if (c == 0xE0) low = 0xA0;
      if (c == 0xED) high = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      length = 4;
      if (c == 0xF0) low = 0x90;
      if (c == 0xF4) high = 0x8F;
    }
    bool valid = length > 0 && i + length <= n && s[i + 1] >= low && s[i + 1] <= high;
    for (size_t k = 2; valid && k < length; ++k) valid = s[i + k] >= 0x80 && s[i + k] <= 0xBF;
    if (!valid) {  // a stray byte: one replacement each
      out += kReplacement;
      ++i;
      continue;
    }
    // U+FFFE and U+FFFF are well-formed UTF-8 but no XML characters: one replacement each.
    const bool noncharacter = length == 3 && c == 0xEF && s[i + 1] == 0xBF && s[i + 2] >= 0xBE;
    if (noncharacter) {
      out += kReplacement;
    } else {
      out.append(text, i, length);
    }
    i += length;
  }
  return out;
}

std::vector<std::string> kinds_in_order(const Report& report) {
  std::vector<std::string> kinds;
  for (const auto& e : report.entries) {
    if (kinds.empty() || kinds.back() != e.kind) kinds.push_back(e.kind);
  }
  return kinds;
}

/// What every row of `kind` drew, gathered: the "exercised" section's figures.
struct Exercised {
  std::vector<std::string> dtypes;
  std::set<int64_t> widths, batches, world_sizes;
  bool training = false, eval = false;
  bool generated = false;  ///< some row ran on generated trees
  Drawn trained;           ///< the training loop's rows (P17), summed over dtypes
  int trained_cases = 0;
  Drawn most;  ///< the row with the most exercised cases, for the leaves outside P17
  int even_rows = 0, uneven_rows = 0, empty_rows = 0;  ///< across ranks, summed over rows
};

Exercised gather(const Report& report, const std::string& kind) {
  Exercised x;
  for (const auto& e : report.entries) {
    if (e.kind != kind) continue;
    if (!e.dtype.empty() && e.exercised > 0 &&
        std::find(x.dtypes.begin(), x.dtypes.end(), e.dtype) == x.dtypes.end()) {
      x.dtypes.push_back(e.dtype);
    }
    if (e.drawn.empty()) continue;
    x.generated = true;
    const auto& d = e.drawn;
    x.widths.insert(d.widths.begin(), d.widths.end());
    x.batches.insert(d.batches.begin(), d.batches.end());
    x.training = x.training || d.training > 0;
    x.eval = x.eval || d.eval > 0;
    const auto ranks = e.target.find("world size ");
    x.world_sizes.insert(ranks == std::string::npos ? 1 : std::stoll(e.target.substr(ranks + 11)));
    if (d.sgd + d.adam > 0) {
      x.trained_cases += d.training + d.eval;
      x.trained.sgd += d.sgd;
      x.trained.adam += d.adam;
      x.trained.frozen += d.frozen;
      x.trained.mode_leaves += d.mode_leaves;
      x.trained.cloneable += d.cloneable;
    }
    x.even_rows += d.even_rows;
    x.uneven_rows += d.uneven_rows;
    x.empty_rows += d.empty_rows;
    if (d.training + d.eval > x.most.training + x.most.eval) x.most = d;
  }
  return x;
}

std::string set_text(const std::set<int64_t>& values) {
  if (values.empty()) return "none";
  const auto lo = *values.begin();
  const auto hi = *values.rbegin();
  if (values.size() > 2 && static_cast<int64_t>(values.size()) == hi - lo + 1) {
    return std::to_string(lo) + "-" + std::to_string(hi);
  }
  std::string out;
  for (const auto v : values) out += (out.empty() ? "" : ", ") + std::to_string(v);
  return out;
}

std::string in_cases(int cases, const std::string& what) {
  return cases > 0 ? std::to_string(cases) + " with " + what : "no " + what + " drawn";
}

}  // namespace

std::string exercised_text(const Report& report, const std::string& kind) {
  const auto x = gather(report, kind);
  if (!x.generated) return "no generated case held " + kind;
  std::string dtypes;
  for (const auto& d : x.dtypes) dtypes += (dtypes.empty() ? "" : ", ") + d;
  std::string out = "dtypes " + (dtypes.empty() ? std::string("none run") : dtypes) + "; widths " +
                    set_text(x.widths) + "; batches " + set_text(x.batches) + "; " +
                    (x.training && x.eval ? "training and eval mode"
                     : x.training         ? "training mode (no eval mode drawn)"
                                          : "eval mode (no training mode drawn)") +
                    "; ";
  // The leaves: as the training loop drew them where it ran, else as the largest row did.
  const bool trained = x.trained_cases > 0;
  const auto& leaves = trained ? x.trained : x.most;
  if (trained) {
    out += "trained " + std::to_string(x.trained_cases) +
           " cases (P17: " + std::to_string(props::kTrainingOptimizerSteps) + " optimizer steps, " +
           std::to_string(props::kTrainingNoGradCalls) + " no-grad call and " +
           std::to_string(props::kTrainingModeSwitches) +
           " mode switches each; SGD(momentum=0.9) in " + std::to_string(x.trained.sgd) +
           ", Adam in " + std::to_string(x.trained.adam) + "), ";
  } else {
    out += "no training loop run (P17 not certified here), ";
  }
  out += in_cases(leaves.frozen, "frozen parameters") + ", " +
         in_cases(leaves.mode_leaves, "mode-dependent leaves") + ", " +
         in_cases(leaves.cloneable, "cloneable LibTorch leaves") + "; world size" +
         (x.world_sizes.size() > 1 ? "s " : " ") + set_text(x.world_sizes) +
         (x.world_sizes == std::set<int64_t>{1} ? " (one process: nothing sharded)" : "");
  if (x.world_sizes != std::set<int64_t>{1}) {
    out += "; widths against the ranks: " + std::to_string(x.even_rows) + " even, " +
           std::to_string(x.uneven_rows) + " uneven, " +
           (x.empty_rows > 0 ? std::to_string(x.empty_rows) + " with a rank holding no row"
                             : std::string("no rank without a row drawn"));
  }
  return out;
}

std::string to_summary(const Report& report) {
  const auto kinds = kinds_in_order(report);
  std::vector<std::pair<std::string, std::string>> rows;  // property, target, in order
  std::map<std::pair<std::string, std::string>, std::map<std::string, const Entry*>> results;
  for (const auto& e : report.entries) {
    const auto row = std::make_pair(e.property, target_label(e));
    if (!results.count(row)) rows.push_back(row);
    results[row][e.kind] = &e;
  }
  std::ostringstream out;
  out << "Certification, " << subject_name(report.options)
      << " unwrap: " << report.count(Status::kPassed) << " passed, "
      << report.count(Status::kFailed) << " failed, " << report.count(Status::kSkipped)
      << " skipped (seed " << report.options.seed << ", " << report.options.cases
      << " cases per property; a number is how many cases held the kind)\n\n"
      << "| property | target |";
  for (const auto& k : kinds) out << " " << k << " |";
  out << "\n|---|---|";
  for (size_t i = 0; i < kinds.size(); ++i) out << ":---:|";
  out << "\n";
  for (const auto& row : rows) {
    out << "| " << row.first << " | " << row.second << " |";
    for (const auto& k : kinds) {
      const auto& r = results[row];
      const auto it = r.find(k);
      if (it == r.end()) {
        out << "  |";
        continue;
      }
      const auto& e = *it->second;
      out << " "
          << (e.status == Status::kPassed   ? "pass"
              : e.status == Status::kFailed ? "**FAIL**"
                                            : "skip")
          << (e.exercised >= 0 ? " " + std::to_string(e.exercised) : std::string()) << " |";
    }
    out << "\n";
  }
  out << "\nExercised:\n";
  for (const auto& k : kinds) {
    if (k == "hardware") continue;
    out << "- " << k << ": " << exercised_text(report, k) << "\n";
  }
  return out.str();
}

std::string to_markdown(const Report& report) {
  std::ostringstream out;
  out << "# wrapcert certification (" << subject_name(report.options) << " unwrap)\n\n"
      << report.count(Status::kPassed) << " passed, " << report.count(Status::kFailed)
      << " failed, " << report.count(Status::kSkipped) << " skipped; seed " << report.options.seed
      << ", " << report.options.cases << " cases per property\n";
  for (const auto& kind : kinds_in_order(report)) {
    out << "\n## " << kind << "\n";
    if (kind != "hardware") out << "\nExercised: " << exercised_text(report, kind) << ".\n";
    out << "\n| property | target | result | cases | exercised | seconds | details |\n"
        << "|---|---|---|---:|---:|---:|---|\n";
    for (const auto& e : report.entries) {
      if (e.kind != kind) continue;
      std::string details = e.reason;
      if (!e.key.empty()) details += " (at `" + e.key + "`)";
      if (!e.coverage.empty()) details += (details.empty() ? "" : "; ") + e.coverage;
      out << "| " << e.property << " | " << target_label(e) << " | "
          << (e.status == Status::kFailed ? "**FAILED**" : to_string(e.status)) << " | " << e.cases
          << " | " << (e.exercised >= 0 ? std::to_string(e.exercised) : "-") << " | " << std::fixed
          << std::setprecision(2) << e.seconds << " | " << cell(details) << " |\n";
    }
    for (const auto& e : report.entries) {
      if (e.kind != kind || e.counterexample.empty()) continue;
      out << "\n"
          << e.property << " [" << target_label(e) << "] counterexample:\n\n```\n"
          << e.counterexample << "\n```\n";
    }
    for (const auto& e : report.entries) {
      if (e.kind != kind || e.replay.empty()) continue;
      out << "\nReplay " << e.property << " [" << target_label(e) << "]: `" << e.replay << "`\n";
    }
  }
  return out.str();
}

namespace {
std::vector<std::string> dtype_names(const Options& options) {
  std::vector<std::string> names;
  for (const auto dtype : options.dtypes) names.emplace_back(gen::to_string(dtype));
  return names;
}
std::vector<std::string> model_names(const Options& options) {
  std::vector<std::string> names;
  for (const auto& model : options.models) names.push_back(model.name);
  return names;
}
}  // namespace

std::string to_json(const Report& report) {
  nlohmann::json j;
  j["context"] = {
      {"wrapcert_version", WRAPCERT_VERSION},
      {"libtorch_version", TORCH_VERSION},
      {"seed", report.options.seed},
      {"options",
       {{"kinds", report.options.kinds},
        {"fixtures", model_names(report.options)},
        {"subject", subject_name(report.options)},
        {"cases", report.options.cases},
        {"dtypes", dtype_names(report.options)},
        {"max_size", report.options.max_size},
        {"isolate", report.options.isolate},
        {"timeout_seconds", report.options.timeout_seconds}}},
  };
  j["summary"] = {{"passed", report.count(Status::kPassed)},
                  {"failed", report.count(Status::kFailed)},
                  {"skipped", report.count(Status::kSkipped)}};
  j["exercised"] = nlohmann::json::object();
  for (const auto& kind : kinds_in_order(report)) {
    if (kind == "hardware") continue;
    const auto x = gather(report, kind);
    j["exercised"][kind] = {
        {"text", exercised_text(report, kind)},
        {"dtypes", x.dtypes},
        {"widths", x.widths},
        {"batches", x.batches},
        {"modes", (x.training && x.eval ? std::vector<std::string>{"training", "eval"}
                   : x.training         ? std::vector<std::string>{"training"}
                   : x.eval             ? std::vector<std::string>{"eval"}
                                        : std::vector<std::string>{})},
        {"trained_cases", x.trained_cases},
        {"optimizer_steps", x.trained_cases * props::kTrainingOptimizerSteps},
        {"no_grad_calls", x.trained_cases * props::kTrainingNoGradCalls},
        {"mode_switches", x.trained_cases * props::kTrainingModeSwitches},
        {"optimizers", {{"SGD(momentum=0.9)", x.trained.sgd}, {"Adam", x.trained.adam}}},
        {"world_sizes", x.world_sizes}};
  }
  j["entries"] = nlohmann::json::array();
  for (const auto& e : report.entries) {
    j["entries"].push_back({{"kind", e.kind},
                            {"property", e.property},
                            {"target", e.target},
                            {"dtype", e.dtype},
                            {"status", to_string(e.status)},
                            {"reason", e.reason},
                            {"key", e.key},
                            {"counterexample", e.counterexample},
                            {"cases", e.cases},
                            {"exercised", e.exercised},
                            {"coverage", e.coverage},
                            {"seconds", e.seconds},
                            {"replay", e.replay}});
    if (!e.drawn.empty()) {
      const auto& d = e.drawn;
      j["entries"].back()["drawn"] = {{"widths", d.widths},
                                      {"batches", d.batches},
                                      {"training", d.training},
                                      {"eval", d.eval},
                                      {"frozen", d.frozen},
                                      {"mode_leaves", d.mode_leaves},
                                      {"cloneable", d.cloneable},
                                      {"sgd", d.sgd},
                                      {"adam", d.adam},
                                      {"even_rows", d.even_rows},
                                      {"uneven_rows", d.uneven_rows},
                                      {"empty_rows", d.empty_rows}};
    }
  }
  return j.dump(2) + "\n";
}

namespace {

/// Seconds as JUnit readers show them: milliseconds, not 17 digits.
std::string seconds_text(double seconds) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(3) << seconds;
  return out.str();
}

}  // namespace

std::string to_junit(const Report& report) {
  pugi::xml_document doc;
  auto decl = doc.append_child(pugi::node_declaration);
  decl.append_attribute("version") = "1.0";
  decl.append_attribute("encoding") = "UTF-8";
  auto suites = doc.append_child("testsuites");
  suites.append_attribute("name") = "wrapcert certify";
  suites.append_attribute("tests") = static_cast<unsigned long long>(report.entries.size());
  suites.append_attribute("failures") =
      static_cast<unsigned long long>(report.count(Status::kFailed));
  for (const auto& kind : kinds_in_order(report)) {
    size_t tests = 0, failures = 0, skipped = 0;
    double seconds = 0;
    for (const auto& e : report.entries) {
      if (e.kind != kind) continue;
      ++tests;
      failures += e.status == Status::kFailed;
      skipped += e.status == Status::kSkipped;
      seconds += e.seconds;
    }
    auto suite = suites.append_child("testsuite");
    suite.append_attribute("name") = xml_text(kind).c_str();
    suite.append_attribute("tests") = static_cast<unsigned long long>(tests);
    suite.append_attribute("failures") = static_cast<unsigned long long>(failures);
    suite.append_attribute("skipped") = static_cast<unsigned long long>(skipped);
    suite.append_attribute("time") = seconds_text(seconds).c_str();
    if (kind != "hardware") {
      auto property = suite.append_child("properties").append_child("property");
      property.append_attribute("name") = "exercised";
      property.append_attribute("value") = xml_text(exercised_text(report, kind)).c_str();
    }
    for (const auto& e : report.entries) {
      if (e.kind != kind) continue;
      auto test = suite.append_child("testcase");
      test.append_attribute("classname") = xml_text(kind).c_str();
      test.append_attribute("name") = xml_text(e.property + " [" + target_label(e) + "]").c_str();
      test.append_attribute("time") = seconds_text(e.seconds).c_str();
      if (e.status == Status::kFailed) {
        auto failure = test.append_child("failure");
        failure.append_attribute("message") = xml_text(e.reason).c_str();
        failure.text() =
            xml_text(e.reason + (e.key.empty() ? "" : " at '" + e.key + "'") + "\n" +
                     e.counterexample + (e.replay.empty() ? "" : "\nreplay: " + e.replay))
                .c_str();
      } else if (e.status == Status::kSkipped) {
        test.append_child("skipped").append_attribute("message") = xml_text(e.reason).c_str();
      }
    }
  }
  std::ostringstream out;
  doc.save(out, "  ", pugi::format_default | pugi::format_no_declaration);
  return out.str();
}

}  // namespace wrapcert::certify
