#pragma once
/// gmock matchers for wrapcert's errors and key lists, which say what they got when they fail.
///
///   EXPECT_THAT([&] { (void)wrap(model, "model.layers.7.mlp", "DataParallel"); },
///               ThrowsError(ErrorCode::kUnknownPath, "model.layers.7"));
///   EXPECT_THAT([&] { load(file); }, ThrowsError(ErrorCode::kMalformedInput, _,
///   HasSubstr("CRC"))); EXPECT_THAT(state_dict(model), HasKeys(ElementsAre("weight", "bias")));
///   EXPECT_THAT(unwrap_reference(wrapped).state_dict(), HasKeys(keys(original)));

#include <wrapcert/error.h>
#include <wrapcert/view.h>

#include <gmock/gmock.h>

#include <exception>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

namespace wrapcert::test_support {

/// Matches a callable that throws `wrapcert::Error` with a code, a key path and a message that
/// match; anything else it throws, or nothing, is explained.
class ThrowsErrorMatcher {
 public:
  using is_gtest_matcher = void;

  ThrowsErrorMatcher(ErrorCode code, ::testing::Matcher<const std::string&> path,
                     ::testing::Matcher<const std::string&> message)
      : code_(code), path_(std::move(path)), message_(std::move(message)) {}

  template <typename Callable>
  bool MatchAndExplain(const Callable& callable, std::ostream* os) const {
    try {
      callable();
    } catch (const Error& e) {
      if (os) {
        *os << "throws " << to_string(e.code()) << " at '" << e.key_path() << "': " << e.what();
      }
      return e.code() == code_ && path_.Matches(e.key_path()) && message_.Matches(e.what());
    } catch (const std::exception& e) {
      if (os) *os << "throws a std::exception that is no wrapcert::Error: " << e.what();
      return false;
    } catch (...) {
      if (os) *os << "throws something that is no std::exception";
      return false;
    }
    if (os) *os << "throws nothing";
    return false;
  }

  void DescribeTo(std::ostream* os) const {
    *os << "throws wrapcert::Error " << to_string(code_) << " with a key path that ";
    path_.DescribeTo(os);
    *os << " and a message that ";
    message_.DescribeTo(os);
  }
  void DescribeNegationTo(std::ostream* os) const {
    *os << "does not ";
    DescribeTo(os);
  }

 private:
  ErrorCode code_;
  ::testing::Matcher<const std::string&> path_;
  ::testing::Matcher<const std::string&> message_;
};

/// A callable that throws `wrapcert::Error` with `code`, at a key path matching `path`, with a
/// message matching `message` (both: anything, unless given).
inline ThrowsErrorMatcher ThrowsError(
    ErrorCode code, ::testing::Matcher<const std::string&> path = ::testing::_,
    ::testing::Matcher<const std::string&> message = ::testing::_) {
  return {code, std::move(path), std::move(message)};
}

/// Matches a state dict whose keys, in order, match a matcher of `std::vector<std::string>`
/// (or equal a key list), and prints the keys when they do not.
class HasKeysMatcher {
 public:
  using is_gtest_matcher = void;

  explicit HasKeysMatcher(::testing::Matcher<const std::vector<std::string>&> keys)
      : keys_(std::move(keys)) {}

  bool MatchAndExplain(const StateDict& state, std::ostream* os) const {
    const auto got = state.keys();
    ::testing::StringMatchResultListener inner;
    const bool matched = keys_.MatchAndExplain(got, &inner);
    if (os) {
      *os << "has keys " << ::testing::PrintToString(got);
      if (!inner.str().empty()) *os << ", " << inner.str();
    }
    return matched;
  }

  void DescribeTo(std::ostream* os) const {
    *os << "has keys that ";
    keys_.DescribeTo(os);
  }
  void DescribeNegationTo(std::ostream* os) const {
    *os << "has keys that ";
    keys_.DescribeNegationTo(os);
  }

 private:
  ::testing::Matcher<const std::vector<std::string>&> keys_;
};

inline HasKeysMatcher HasKeys(::testing::Matcher<const std::vector<std::string>&> keys) {
  return HasKeysMatcher(std::move(keys));
}

}  // namespace wrapcert::test_support
