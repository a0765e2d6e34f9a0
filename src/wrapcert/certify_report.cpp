#include <wrapcert/certify.h>

#include <torch/version.h>
#include <nlohmann/json.hpp>

#include <iomanip>
#include <map>
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

/// Hand-written: the stack has no XML library, and JUnit needs only escaped text.
std::string xml(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
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

}  // namespace

std::string to_summary(const Report& report) {
  const auto kinds = kinds_in_order(report);
  std::vector<std::pair<std::string, std::string>> rows;  // property, target, in order
  std::map<std::pair<std::string, std::string>, std::map<std::string, Status>> results;
  for (const auto& e : report.entries) {
    const auto row = std::make_pair(e.property, e.target);
    if (!results.count(row)) rows.push_back(row);
    results[row][e.kind] = e.status;
  }
  std::ostringstream out;
  out << "Certification, " << subject_name(report.options)
      << " unwrap: " << report.count(Status::kPassed) << " passed, "
      << report.count(Status::kFailed) << " failed, " << report.count(Status::kSkipped)
      << " skipped (seed " << report.options.seed << ", " << report.options.cases
      << " cases per property)\n\n"
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
      out << " "
          << (it == r.end()                   ? ""
              : it->second == Status::kPassed ? "pass"
              : it->second == Status::kFailed ? "**FAIL**"
                                              : "skip")
          << " |";
    }
    out << "\n";
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
    out << "\n## " << kind << "\n\n| property | target | result | cases | seconds | details |\n"
        << "|---|---|---|---:|---:|---|\n";
    for (const auto& e : report.entries) {
      if (e.kind != kind) continue;
      std::string details = e.reason;
      if (!e.key.empty()) details += " (at `" + e.key + "`)";
      out << "| " << e.property << " | " << e.target << " | "
          << (e.status == Status::kFailed ? "**FAILED**" : to_string(e.status)) << " | " << e.cases
          << " | " << std::fixed << std::setprecision(2) << e.seconds << " | " << cell(details)
          << " |\n";
    }
    for (const auto& e : report.entries) {
      if (e.kind != kind || e.counterexample.empty()) continue;
      out << "\n" << e.property << " counterexample:\n\n```\n" << e.counterexample << "\n```\n";
    }
    for (const auto& e : report.entries) {
      if (e.kind != kind || e.replay.empty()) continue;
      out << "\nReplay " << e.property << " [" << e.target << "]: `" << e.replay << "`\n";
    }
  }
  return out.str();
}

std::string to_json(const Report& report) {
  nlohmann::json j;
  j["context"] = {
      {"wrapcert_version", WRAPCERT_VERSION},
      {"libtorch_version", TORCH_VERSION},
      {"seed", report.options.seed},
      {"options",
       {{"kinds", report.options.kinds},
        {"fixtures", report.options.fixtures},
        {"subject", subject_name(report.options)},
        {"cases", report.options.cases},
        {"max_size", report.options.max_size},
        {"isolate", report.options.isolate},
        {"timeout_seconds", report.options.timeout_seconds}}},
  };
  j["summary"] = {{"passed", report.count(Status::kPassed)},
                  {"failed", report.count(Status::kFailed)},
                  {"skipped", report.count(Status::kSkipped)}};
  j["entries"] = nlohmann::json::array();
  for (const auto& e : report.entries) {
    j["entries"].push_back({{"kind", e.kind},
                            {"property", e.property},
                            {"target", e.target},
                            {"status", to_string(e.status)},
                            {"reason", e.reason},
                            {"key", e.key},
                            {"counterexample", e.counterexample},
                            {"cases", e.cases},
                            {"seconds", e.seconds},
                            {"replay", e.replay}});
  }
  return j.dump(2) + "\n";
}

std::string to_junit(const Report& report) {
  std::ostringstream out;
  out << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"wrapcert certify\" "
         "tests=\""
      << report.entries.size() << "\" failures=\"" << report.count(Status::kFailed) << "\">\n";
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
    out << "  <testsuite name=\"" << xml(kind) << "\" tests=\"" << tests << "\" failures=\""
        << failures << "\" skipped=\"" << skipped << "\" time=\"" << seconds << "\">\n";
    for (const auto& e : report.entries) {
      if (e.kind != kind) continue;
      out << "    <testcase classname=\"" << xml(kind) << "\" name=\""
          << xml(e.property + " [" + e.target + "]") << "\" time=\"" << e.seconds << "\">";
      if (e.status == Status::kFailed) {
        out << "\n      <failure message=\"" << xml(e.reason) << "\">"
            << xml(e.reason + (e.key.empty() ? "" : " at '" + e.key + "'") + "\n" +
                   e.counterexample + (e.replay.empty() ? "" : "\nreplay: " + e.replay))
            << "</failure>\n    ";
      } else if (e.status == Status::kSkipped) {
        out << "\n      <skipped message=\"" << xml(e.reason) << "\"/>\n    ";
      }
      out << "</testcase>\n";
    }
    out << "  </testsuite>\n";
  }
  out << "</testsuites>\n";
  return out.str();
}

}  // namespace wrapcert::certify
