#include "property_check.h"

#include <rapidcheck/detail/Configuration.h>

#include <algorithm>
#include <sstream>

namespace wrapcert::test_support {

Rejection find_rejection(const rc::Gen<gen::TreeSpec>& trees, const PropertyFn& property) {
  auto shrunk = std::make_shared<gen::TreeSpec>();
  auto key = std::make_shared<std::string>();
  // A faulty subject is searched for up to 1,000 cases (the search ends at the first
  // rejection): some faults only show on trees rapidcheck draws a few times in a hundred (three
  // levels of wrappers at the root for a subject that stops after two), and a rejection test
  // must not depend on the seed.
  auto params = rc::detail::configuration().testParams;
  params.maxSuccess = std::max(params.maxSuccess, 1000);
  const auto result = rc::detail::checkTestable(
      [=] {
        const auto spec = *trees;
        const auto verdict = property(spec);
        // Shrinking accepts each smaller failing case in turn: the last one is the minimum.
        if (!verdict.passed && !verdict.skipped) {
          *shrunk = spec;
          *key = verdict.key;
        }
        assert_verdict(verdict);
      },
      rc::detail::TestMetadata{}, params);
  Rejection out;
  rc::detail::FailureResult failure;
  if (!result.match(failure)) {
    std::ostringstream text;
    rc::detail::printResultMessage(result, text);
    out.message = text.str();
    return out;
  }
  out.rejected = true;
  out.message = failure.description;
  out.counterexample = gen::describe(*shrunk, *key);
  out.modules = gen::stats(*shrunk).modules;
  return out;
}

}  // namespace wrapcert::test_support
