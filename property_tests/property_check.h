#pragma once
/// Glue between the plain property functions and rapidcheck: run one as a property, or check
/// that a property rejects a subject and report the shrunk counterexample.
///
///   RC_GTEST_PROP(Reference, P1Keys, ()) { wrapcert::test_support::assert_verdict(...); }

#include <wrapcert/certify/properties.h>
#include <wrapcert/gen/generators.h>

#include <rapidcheck.h>

#include <functional>
#include <string>

namespace wrapcert::test_support {

using PropertyFn = std::function<props::Verdict(const gen::TreeSpec&)>;

/// Inside a property: discards a case the property does not apply to, logs the reason of a
/// failure, and asserts.
inline void assert_verdict(const props::Verdict& v) {
  RC_PRE(!v.skipped);
  RC_LOG() << v.property << ": " << v.reason << (v.key.empty() ? "" : " at '" + v.key + "'")
           << "\n";
  RC_ASSERT(v.passed);
}

struct Rejection {
  bool rejected = false;
  std::string counterexample;  ///< the shrunk spec, printed as a module tree with its keys
  int modules = 0;             ///< modules in the shrunk spec
  std::string message;
};

/// Runs `property` over `trees` with the configured rapidcheck parameters (RC_PARAMS) and
/// says whether it found a failing case, shrunk.
Rejection find_rejection(const rc::Gen<gen::TreeSpec>& trees, const PropertyFn& property);

}  // namespace wrapcert::test_support
