// Every property is shown able to fail: each rejects the wrong subject it is designed to catch,
// with a shrunk counterexample printed as a module tree (docs/SEMANTICS.md §4).

#include "faulty_subjects.h"
#include "property_check.h"

#include <wrapcert/test_support/contract_kinds.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <iostream>
#include <optional>

namespace wrapcert {
namespace {

using props::UnwrapSubject;
using namespace wrapcert::test_support;  // NOLINT(google-build-using-namespace): the faulty kinds

struct Case {
  std::string name;
  test_support::PropertyFn property;
  gen::GenOptions options;
  /// A faulty wrapper kind registered while the case runs (the contract properties' subject).
  WrapperKind (*kind)() = nullptr;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.name;
}

gen::GenOptions plain() {
  gen::GenOptions o;
  o.wrappers = false;
  return o;
}
gen::GenOptions root_chain() {
  gen::GenOptions o;
  o.root_chain_only = true;
  return o;
}
/// Trees of `kind` mixed with DataParallel.
gen::GenOptions with_kind(WrapperKind (*kind)()) {
  gen::GenOptions o;
  o.kinds = {kind().name, "DataParallel"};
  return o;
}
gen::GenOptions with_flat() {
  gen::GenOptions o;
  o.kinds = {gen::kFlatFsdp, "DataParallel"};
  return o;
}

test_support::PropertyFn with(props::Verdict (*check)(const gen::TreeSpec&, const UnwrapSubject&),
                              UnwrapSubject subject) {
  return [=](const gen::TreeSpec& spec) { return check(spec, subject); };
}
/// A property of the kinds in the tree (P14-P16).
test_support::PropertyFn on_kinds(props::Verdict (*check)(const gen::TreeSpec&)) {
  return check;
}

std::vector<Case> cases() {
  using namespace props;  // NOLINT(google-build-using-namespace): the property list below
  const auto legacy = subject(BuiltinUnwrap::kLegacy);
  const auto duck = subject(BuiltinUnwrap::kDuckTyped);
  return {
      {"P1KeysRejectsLegacy", with(&props::exact_keys, legacy), {}},
      {"P1KeysRejectsSkippingContainers",
       with(&props::exact_keys, faulty::skips_wrappers_in_containers()),
       {}},
      {"P1KeysRejectsStoppingAfterTwoLevels",
       with(&props::exact_keys, faulty::stops_after_two_levels()),
       {}},
      {"P1KeysRejectsReordering", with(&props::exact_keys, faulty::reorders_keys()), {}},
      {"P2IdentityRejectsCopies", with(identity, faulty::copies_tensors()), {}},
      {"P3TiesRejectsUntying", with(ties, faulty::unties_weights()), {}},
      {"P4BackwardRejectsLegacy", with(backward, legacy), {}},
      {"P5NonMutationRejectsMutation", with(non_mutation, faulty::mutates_input()), {}},
      {"P5NonMutationRejectsDuckTyped", with(non_mutation, duck), {}},
      {"P6LawsRejectsReordering", with(laws, faulty::reorders_keys()), {}},
      {"P7LegacyAgreementRejectsStoppingAfterTwoLevels",
       with(legacy_agreement, faulty::stops_after_two_levels()), root_chain()},
      {"P8TranslationRejectsSubstringRewriting",
       [](const gen::TreeSpec& s) { return props::translation(s, faulty::substring_translator()); },
       {}},
      {"P9NoFalsePositivesRejectsDuckTyped", with(no_false_positives, duck), plain()},
      {"P10RoundTripRejectsSkippingContainers",
       with(round_trip, faulty::skips_wrappers_in_containers()),
       {}},
      {"P11GraphSafetyRejectsDuckTyped", with(graph_safety, duck), {}},
      {"P12OrderRejectsStoppingAfterTwoLevels",
       [](const gen::TreeSpec& s) { return props::order(s, faulty::stops_after_two_levels(), 7); },
       {}},
      {"P13ValuesRejectsDroppedFlatRestoration", with(values, faulty::drops_flat_restoration()),
       with_flat()},
      {"P14ReleaseRejectsACopyingRelease", on_kinds(release), with_kind(copying_release_kind),
       copying_release_kind},
      {"P14ReleaseRejectsAReleaseThatEmptiesTheWrapper", on_kinds(release),
       with_kind(emptying_release_kind), emptying_release_kind},
      {"P14ReleaseRejectsASwappedFlatRestoration", on_kinds(release),
       with_kind(swapped_flat_release_kind), swapped_flat_release_kind},
      {"P15OwnedStateRejectsASecondRegistration", on_kinds(owned_state),
       with_kind(second_registration_kind), second_registration_kind},
      {"P16AliasesRejectsAnAliasToAnotherModule", on_kinds(aliases),
       with_kind(misdirected_alias_kind), misdirected_alias_kind},
      // The trained model saved by the legacy unwrap keeps nested wrappers' slots in its keys.
      {"P17TrainingRejectsLegacy", with(training_loop, legacy), {}},
      {"P17TrainingRejectsAStaleGather", with(training_loop, subject(BuiltinUnwrap::kReference)),
       with_kind(stale_gather_kind), stale_gather_kind},
  };
}

class Rejects : public ::testing::TestWithParam<Case> {};

TEST(Rejects, P11DeepChainRejectsDuckTyped) {
  const auto verdict = props::deep_chain(Registry::with_builtins().names(),
                                         props::subject(BuiltinUnwrap::kDuckTyped));
  EXPECT_FALSE(verdict.passed);
  EXPECT_THAT(verdict.reason, ::testing::HasSubstr("maximum recursion depth exceeded"));
}

TEST_P(Rejects, ItsFaultySubjectWithASmallCounterexample) {
  const auto& c = GetParam();
  std::optional<ScopedRegistration> registered;
  if (c.kind) registered.emplace(c.kind());
  const auto result = test_support::find_rejection(gen::trees(c.options), c.property);
  ASSERT_TRUE(result.rejected) << c.name << " accepted its faulty subject:\n" << result.message;
  std::cout << c.name << ": shrunk to " << result.modules << " modules\n"
            << result.message << "\n"
            << result.counterexample << "\n";
  RecordProperty("shrunk_modules", result.modules);
  EXPECT_LE(result.modules, 12) << "the counterexample did not shrink:\n" << result.counterexample;
}

INSTANTIATE_TEST_SUITE_P(Properties, Rejects, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace wrapcert
