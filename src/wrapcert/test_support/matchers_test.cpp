// The matchers fail where they should, and say what they got.
#include <wrapcert/error.h>
#include <wrapcert/test_support/matchers.h>

#include <torch/types.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <stdexcept>
#include <string>

namespace wrapcert::test_support {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

/// What `matcher` says about `value` (the text a failed EXPECT_THAT prints after "which").
template <typename T, typename M>
std::string explain(const M& matcher, const T& value) {
  ::testing::StringMatchResultListener listener;
  (void)::testing::Matcher<T>(matcher).MatchAndExplain(value, &listener);
  return listener.str();
}

using Callable = std::function<void()>;

TEST(ThrowsError, MatchesTheCodeThePathAndTheMessage) {
  auto throws = [] { throw Error(ErrorCode::kUnknownPath, "model.layers.7", "no such layer"); };
  EXPECT_THAT(throws, ThrowsError(ErrorCode::kUnknownPath));
  EXPECT_THAT(throws, ThrowsError(ErrorCode::kUnknownPath, "model.layers.7"));
  EXPECT_THAT(throws, ThrowsError(ErrorCode::kUnknownPath, "model.layers.7", HasSubstr("layer")));
  EXPECT_THAT(throws, Not(ThrowsError(ErrorCode::kCycle)));
  EXPECT_THAT(throws, Not(ThrowsError(ErrorCode::kUnknownPath, "model.layers.6")));
  EXPECT_THAT(throws, Not(ThrowsError(ErrorCode::kUnknownPath, "model.layers.7", "x")));
}

TEST(ThrowsError, RejectsNothingAndOtherExceptionsAndSaysSo) {
  auto nothing = [] {};
  auto other = [] { throw std::runtime_error("disk full"); };
  const auto m = ThrowsError(ErrorCode::kMalformedInput);
  EXPECT_THAT(nothing, Not(m));
  EXPECT_THAT(other, Not(m));
  EXPECT_EQ(explain<Callable>(m, nothing), "throws nothing");
  EXPECT_THAT(explain<Callable>(m, other), HasSubstr("no wrapcert::Error: disk full"));
  auto wrong = [] { throw Error(ErrorCode::kCycle, "a.b", "loop"); };
  EXPECT_THAT(explain<Callable>(m, wrong), HasSubstr("at 'a.b'"));
}

TEST(HasKeys, ComparesKeysInOrderAndPrintsThem) {
  StateDict state;
  state.insert("weight", torch::zeros({1}));
  state.insert("bias", torch::zeros({1}));
  EXPECT_THAT(state, HasKeys(ElementsAre("weight", "bias")));
  EXPECT_THAT(state, HasKeys(std::vector<std::string>{"weight", "bias"}));
  EXPECT_THAT(state, Not(HasKeys(ElementsAre("bias", "weight"))));
  EXPECT_THAT(state, Not(HasKeys(ElementsAre("weight"))));
  EXPECT_THAT(explain<StateDict>(HasKeys(ElementsAre("weight")), state),
              HasSubstr("has keys { \"weight\", \"bias\" }"));
}

}  // namespace
}  // namespace wrapcert::test_support
