// P1-P17 over generated wrapper trees, from the one table certification uses, against the
// reference unwrap: all must hold.
// Replay a failure with RC_PARAMS="reproduce=..." as printed; see the README.

#include "property_check.h"

#include <gtest/gtest.h>
#include <rapidcheck.h>

#include <cctype>
#include <ostream>

namespace wrapcert {

namespace props {
void PrintTo(const GeneratedProperty& property, std::ostream* os) {
  *os << property.name;
}
}  // namespace props

namespace {

using test_support::assert_verdict;

const props::UnwrapSubject& reference() {
  static const auto s = props::subject(BuiltinUnwrap::kReference);
  return s;
}

gen::TreeSpec tree(gen::GenOptions options = {}) {
  const auto spec = *gen::trees(std::move(options));
  gen::classify(spec);
  return spec;
}

/// Every property of the table, on trees of every built-in kind and mode (flat parameters
/// among them), against the reference unwrap and translator.
class Reference : public ::testing::TestWithParam<props::GeneratedProperty> {};

TEST_P(Reference, HoldsOnGeneratedTrees) {
  const auto& property = GetParam();
  gen::GenOptions options;
  options.kinds = Registry::global().names_with_modes();
  property.adjust(options);
  const auto translator = props::reference_translator();
  EXPECT_TRUE(rc::check(property.name + ": " + property.checks, [&] {
    assert_verdict(property.check(tree(options), reference(), translator));
  }));
}

INSTANTIATE_TEST_SUITE_P(Generated, Reference, ::testing::ValuesIn(props::generated_properties()),
                         [](const auto& info) {
                           auto name = info.param.name;  // "P1 keys" -> "P1_keys"
                           for (auto& c : name)
                             c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return name;
                         });

TEST(DeepChain, OfEveryKindAndModeUnwrapsToTheLeaf) {
  const auto kinds = Registry::global().names_with_modes();
  const auto verdict = props::deep_chain(kinds, reference());
  EXPECT_TRUE(verdict.passed) << verdict.reason;
  for (const auto& kind : kinds) {
    EXPECT_TRUE(props::deep_chain({kind}, reference()).passed) << kind;
  }
}

}  // namespace
}  // namespace wrapcert
