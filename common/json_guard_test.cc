#include "common/json_guard.h"

#include <random>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace ckpt {
namespace {

using ::testing::HasSubstr;

absl::Status Check(const std::string& text, JsonLimits limits = JsonLimits{}) {
  return CheckJson(text, limits);
}

TEST(JsonGuardTest, AcceptsOrdinaryDocuments) {
  EXPECT_TRUE(Check(R"({"mesh": {"tp": 2}, "rules": [{"match": "*", "x": [1, 2.5, null]}]})").ok());
  EXPECT_TRUE(Check("3").ok());
  EXPECT_TRUE(Check(R"({"": 1, "a": {"": 2}})").ok());  // empty keys are keys
  EXPECT_TRUE(Check(R"([{"a": 1}, {"a": 1}])").ok());   // same key in different objects
}

TEST(JsonGuardTest, DeepNestingIsRefusedWithThePathBeforeAnyDomIsBuilt) {
  // 200,000 nested brackets: the old code built the DOM and then overflowed the stack.
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  absl::Status s = Check(deep);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("nested deeper than the limit of 32 levels"));

  JsonLimits limits;
  limits.max_depth = 3;
  s = Check(R"({"rules": [{"comment": {"a": 1}}]})", limits);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(), "rules[0].comment: nested deeper than the limit of 3 levels");
  EXPECT_TRUE(Check(R"({"rules": [{"comment": 1}]})", limits).ok());
}

TEST(JsonGuardTest, RepeatedKeysAreNamed) {
  absl::Status s = Check(R"({"mesh": {"tp": 2, "dp": 2, "tp": 4}, "rules": []})");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(), "mesh: key \"tp\" appears twice in this object");
  // Escapes are resolved before comparing: "\u0074p" is "tp".
  s = Check(R"({"a": [0, {"tp": 1, "\u0074p": 2}]})");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(), "a[1]: key \"tp\" appears twice in this object");
}

TEST(JsonGuardTest, SizeValueCountAndStringLengthAreBounded) {
  JsonLimits limits;
  limits.max_bytes = 10;
  EXPECT_THAT(Check("[1, 2, 3, 4, 5]", limits).message(),
              HasSubstr("15 bytes, more than the limit of 10 bytes"));
  limits = JsonLimits{};
  limits.max_values = 4;
  EXPECT_TRUE(Check("[1, 2, 3]", limits).ok());
  EXPECT_EQ(Check("[1, 2, 3, 4]", limits).message(), "[3]: more than the limit of 4 JSON values");
  limits = JsonLimits{};
  limits.max_string_bytes = 3;
  EXPECT_EQ(Check(R"({"abc": ["abcd"]})", limits).message(),
            "abc[0]: a string of 4 bytes, more than the limit of 3");
  EXPECT_THAT(Check(R"({"abcd": 1})", limits).message(), HasSubstr("a string of 4 bytes"));
}

TEST(JsonGuardTest, InvalidJsonGivesTheParsersPosition) {
  absl::Status s = Check("{\"a\": tru}");
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("(document): not valid JSON: parse error at line 1"));
  EXPECT_THAT(Check("").message(), HasSubstr("not valid JSON"));
  EXPECT_THAT(Check("[1] [2]").message(), HasSubstr("not valid JSON"));
  EXPECT_THAT(Check("\"\xff\"").message(), HasSubstr("not valid JSON"));  // ill-formed UTF-8
  // A huge token is not quoted whole.
  s = Check("[\"" + std::string(100000, 'x'));
  ASSERT_FALSE(s.ok());
  EXPECT_LT(s.message().size(), 400u);
}

// Property: on random small documents (valid or mangled), CheckJson accepts exactly what the
// DOM parser accepts when no limit is reached, and ParseGuardedJson yields the same DOM.
TEST(JsonGuardTest, AgreesWithTheDomParserOnRandomDocuments) {
  std::mt19937 rng(11);
  const char* atoms[] = {"[",     "]",     "{",    "}",    ",", ":",           "1", "-2.5e3",
                         "\"k\"", "\"j\"", "null", "true", " ", "\"\\u00e9\"", "x"};
  for (int iter = 0; iter < 20000; ++iter) {
    std::string text;
    const int n = 1 + rng() % 12;
    for (int i = 0; i < n; ++i) text += atoms[rng() % (sizeof(atoms) / sizeof(atoms[0]))];
    const nlohmann::json dom = nlohmann::json::parse(text, nullptr, false);
    absl::StatusOr<nlohmann::json> guarded = ParseGuardedJson<nlohmann::json>(text, JsonLimits{});
    if (dom.is_discarded()) {
      EXPECT_FALSE(guarded.ok()) << text;
      continue;
    }
    if (!guarded.ok()) {
      // Only a repeated key may separate them.
      EXPECT_THAT(guarded.status().message(), HasSubstr("appears twice")) << text;
      continue;
    }
    EXPECT_EQ(*guarded, dom) << text;
  }
}

}  // namespace
}  // namespace ckpt
