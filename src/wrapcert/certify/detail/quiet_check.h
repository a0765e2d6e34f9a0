#pragma once
/// A rapidcheck property run the way certification runs them: a pinned seed and size, and no
/// console output (rapidcheck's default listener would also report each failure again at
/// process exit; certification reports its own).
///
///   const auto result = detail::check_quietly("Kind.P1 keys", seed, 100, 100, [&] { ... });

#include <rapidcheck.h>

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <string>

namespace wrapcert::detail {

class QuietListener : public rc::detail::TestListener {
 public:
  void onTestCaseFinished(const rc::detail::CaseDescription&) override {}
  void onShrinkTried(const rc::detail::CaseDescription&, bool) override {}
  void onTestFinished(const rc::detail::TestMetadata&, const rc::detail::TestResult&) override {}
};

/// Has rapidcheck read its configuration (and print it, which it does once per process) with
/// the run's seed in place of any seed RC_PARAMS names, the other settings kept: the printed
/// "Using configuration: seed=..." line then names the seed the run uses.
inline void announce_configuration(uint64_t seed) {
  std::string params = "seed=" + std::to_string(seed);
  if (const char* given = std::getenv("RC_PARAMS")) {
    std::istringstream words(given);
    for (std::string word; words >> word;) {
      if (word.rfind("seed=", 0) != 0) params += " " + word;
    }
  }
  ::setenv("RC_PARAMS", params.c_str(), /*overwrite=*/1);
  (void)rc::detail::configuration();
}

inline rc::detail::TestResult check_quietly(const std::string& id, uint64_t seed, int cases,
                                            int max_size, const std::function<void()>& body) {
  rc::detail::TestParams params;
  params.seed = seed;
  params.maxSuccess = cases;
  params.maxSize = max_size;
  QuietListener quiet;
  return rc::detail::checkProperty(rc::detail::toProperty(body), rc::detail::TestMetadata{id, id},
                                   params, quiet);
}

}  // namespace wrapcert::detail
