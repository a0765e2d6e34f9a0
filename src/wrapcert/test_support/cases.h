#pragma once
/// How many generated cases a certification test draws, by what it must show and by build.
///
///   auto o = quick();
///   o.cases = test_support::cases_to_pass(30);  // a correct kind: every case must pass
///   o.cases = 30;                               // a faulty kind: its counterexample must be found
///
/// Under AddressSanitizer and UBSan (scripts/sanitize.sh) a case costs 7-10 times what it costs
/// in the main build, and the main build runs the same suites over the same code with every case.
/// There a run that must pass draws a third of its cases (at least 10): each case still goes
/// through every property, dtype, wrapper and fixture the run names, which is the code the
/// sanitizers watch, and the main build keeps the full count that the verdict's coverage needs.
/// A run that must find a counterexample keeps its count in both builds: the number of cases
/// is what it takes to find one.

#include <algorithm>

namespace wrapcert::test_support {

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kSanitizerBuild = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kSanitizerBuild = true;
#else
inline constexpr bool kSanitizerBuild = false;
#endif
#else
inline constexpr bool kSanitizerBuild = false;
#endif

/// The cases of a run every case of which must pass: `cases` in the main build, a third of them
/// (at least 10, at most `cases`) under the sanitizers.
constexpr int cases_to_pass(int cases) {
  return kSanitizerBuild ? std::min(cases, std::max(10, cases / 3)) : cases;
}

}  // namespace wrapcert::test_support
