// P1-P16 over generated wrapper trees, against the reference unwrap: all must hold.
// Replay a failure with RC_PARAMS="reproduce=..." as printed; see the README.

#include "property_check.h"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

namespace wrapcert {
namespace {

using testing::assert_verdict;

const props::UnwrapSubject& reference() {
  static const auto s = props::subject(Subject::kReference);
  return s;
}

gen::TreeSpec tree(gen::GenOptions options = {}) {
  const auto spec = *gen::trees(std::move(options));
  gen::classify(spec);
  return spec;
}

RC_GTEST_PROP(Reference, P1Keys, ()) {
  assert_verdict(props::keys(tree(), reference()));
}
RC_GTEST_PROP(Reference, P2Identity, ()) {
  assert_verdict(props::identity(tree(), reference()));
}
RC_GTEST_PROP(Reference, P3Ties, ()) {
  assert_verdict(props::ties(tree(), reference()));
}
RC_GTEST_PROP(Reference, P4Backward, ()) {
  assert_verdict(props::backward(tree(), reference()));
}
RC_GTEST_PROP(Reference, P5NonMutation, ()) {
  assert_verdict(props::non_mutation(tree(), reference()));
}
RC_GTEST_PROP(Reference, P6Laws, ()) {
  assert_verdict(props::laws(tree(), reference()));
}
RC_GTEST_PROP(Reference, P7LegacyAgreementOnARootChain, ()) {
  gen::GenOptions options;
  options.root_chain_only = true;
  assert_verdict(props::legacy_agreement(tree(options), reference()));
}
RC_GTEST_PROP(Reference, P8Translation, ()) {
  assert_verdict(props::translation(tree(), props::reference_translator()));
}
RC_GTEST_PROP(Reference, P9NoFalsePositives, ()) {
  gen::GenOptions options;
  options.wrappers = false;
  assert_verdict(props::no_false_positives(tree(options), reference()));
}
RC_GTEST_PROP(Reference, P10RoundTrip, ()) {
  assert_verdict(props::round_trip(tree(), reference()));
}
RC_GTEST_PROP(Reference, P11GraphSafety, ()) {
  assert_verdict(props::graph_safety(tree(), reference()));
}
TEST(Reference, P11DeepChainOfEveryKindAndMode) {
  const auto kinds = Registry::global().names_with_modes();
  const auto verdict = props::deep_chain(kinds, reference());
  EXPECT_TRUE(verdict.passed) << verdict.reason;
  for (const auto& kind : kinds) {
    EXPECT_TRUE(props::deep_chain({kind}, reference()).passed) << kind;
  }
}
RC_GTEST_PROP(Reference, P12Order, (uint64_t shuffle_seed)) {
  assert_verdict(props::order(tree(), reference(), shuffle_seed));
}
/// Every built-in kind and mode, flat parameters among them.
gen::GenOptions every_mode() {
  gen::GenOptions options;
  options.kinds = Registry::global().names_with_modes();
  return options;
}
RC_GTEST_PROP(Reference, P13ValuesWithFlatParameters, ()) {
  assert_verdict(props::values(tree(every_mode()), reference()));
}
RC_GTEST_PROP(Reference, P14Release, ()) {
  assert_verdict(props::release(tree(every_mode())));
}
RC_GTEST_PROP(Reference, P15OwnedState, ()) {
  assert_verdict(props::owned_state(tree(every_mode())));
}
RC_GTEST_PROP(Reference, P16Aliases, ()) {
  assert_verdict(props::aliases(tree(every_mode())));
}

}  // namespace
}  // namespace wrapcert
