#include <wrapcert/error.h>
#include <wrapcert/io/detail/strict_json.h>
#include <wrapcert/test_support/matchers.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>

namespace wrapcert::detail {
namespace {

using test_support::ThrowsError;
using ::testing::HasSubstr;

TEST(StrictJson, KeepsTheOrderOfKeysAndValuesAsWritten) {
  const auto j = parse_json_strictly(R"({"b":1,"a":{"z":[1,{"y":null}],"c":"x"},"m":2.5})",
                                     "f.json", "the header");
  EXPECT_EQ(j.dump(), R"({"b":1,"a":{"z":[1,{"y":null}],"c":"x"},"m":2.5})");
}

TEST(StrictJson, ARepeatedKeyIsNamedByItsDottedPath) {
  EXPECT_THAT([] { parse_json_strictly(R"({"a":{"b":[{"c":1,"c":2}]}})", "f.json", "it"); },
              ThrowsError(ErrorCode::kMalformedInput, "a.b.c", HasSubstr("names 'a.b.c' twice")));
  EXPECT_THAT([] { parse_json_strictly(R"({"w":1,"x":2,"w":3})", "f.json", "the index"); },
              ThrowsError(ErrorCode::kMalformedInput, "w", HasSubstr("the index names 'w'")));
  EXPECT_THAT([] { parse_json_strictly(R"({"w":)", "f.json", "the index"); },
              ThrowsError(ErrorCode::kMalformedInput, "", HasSubstr("is not JSON")));
}

TEST(StrictJson, AnObjectOf300000KeysIsReadInLinearTime) {
  // Appending to an ordered object searched the keys before each one: this took minutes.
  std::string text = "{";
  for (int i = 0; i < 300000; ++i) {
    text += (i ? ",\"k" : "\"k") + std::to_string(i) + "\":" + std::to_string(i);
  }
  const auto j = parse_json_strictly(text + "}", "f.json", "the header");
  ASSERT_EQ(j.size(), 300000u);
  EXPECT_EQ(j.begin().key(), "k0");
  EXPECT_EQ((--j.end()).value(), 299999);
  EXPECT_THAT([&] { parse_json_strictly(text + ",\"k17\":0}", "f.json", "the header"); },
              ThrowsError(ErrorCode::kMalformedInput, "k17"));
}

}  // namespace
}  // namespace wrapcert::detail
