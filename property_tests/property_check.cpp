#include "property_check.h"

#include <rapidcheck/detail/Configuration.h>

#include <sstream>

namespace wrapcert::test_support {

Rejection find_rejection(const rc::Gen<gen::TreeSpec>& trees, const PropertyFn& property) {
  auto shrunk = std::make_shared<gen::TreeSpec>();
  auto key = std::make_shared<std::string>();
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
      rc::detail::TestMetadata{}, rc::detail::configuration().testParams);
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
