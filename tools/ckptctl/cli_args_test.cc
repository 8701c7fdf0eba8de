#include "tools/ckptctl/cli_args.h"

#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tools/ckptctl/commands.h"

namespace ckpt::ckptctl {
namespace {

using ::testing::HasSubstr;

CommandSpec TestSpec() {
  return {"demo",
          "usage: ckptctl demo [flags] <path>",
          "A command for tests.\n",
          {{"memory-budget", "SIZE", "bytes held", "memory_budget_bytes"},
           {"dry-run", "", "change nothing"},
           {"timeout", "DURATION", "how long", "timeout_s"},
           {"max-reports", "N", "at most N lines"}}};
}

absl::StatusOr<ParsedArgs> Parse(std::vector<std::string> args) {
  args.insert(args.begin(), "demo");
  return ParseFlags(TestSpec(), args);
}

TEST(ParseFlags, ValueFlagsTakeTheirValueAfterAnEqualsSignOrAsTheNextArgument) {
  auto a = Parse({"--memory-budget=4G", "p", "--max-reports", "7"});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->Get("memory-budget"), "4G");
  EXPECT_EQ(a->Get("max-reports"), "7");
  EXPECT_EQ(a->positional, std::vector<std::string>{"p"});
  EXPECT_FALSE(a->help);
  // A value may itself look like a flag or be empty when given with '='.
  auto b = Parse({"--max-reports", "--dry-run", "--memory-budget="});
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->Get("max-reports"), "--dry-run");
  EXPECT_TRUE(b->Has("memory-budget"));
  EXPECT_FALSE(b->Has("dry-run"));
}

TEST(ParseFlags, BoolFlagsTakeNoValue) {
  auto a = Parse({"--dry-run", "x"});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(a->Has("dry-run"));
  EXPECT_FALSE(a->Has("timeout"));
  EXPECT_EQ(a->Get("timeout", "fallback"), "fallback");
  auto b = Parse({"--dry-run=yes"});
  ASSERT_FALSE(b.ok());
  EXPECT_THAT(b.status().message(), HasSubstr("--dry-run takes no value"));
}

TEST(ParseFlags, AValueFlagAtTheEndWithoutItsValueIsAnError) {
  auto a = Parse({"x", "--timeout"});
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(a.status().message(), HasSubstr("--timeout needs a value (DURATION)"));
}

TEST(ParseFlags, UnknownFlagsAreErrorsNamingTheFlag) {
  auto a = Parse({"x", "--frobnicate=3"});
  ASSERT_FALSE(a.ok());
  EXPECT_THAT(a.status().message(), HasSubstr("unknown flag --frobnicate"));
  auto b = Parse({"-v"});
  ASSERT_FALSE(b.ok());
  EXPECT_THAT(b.status().message(), HasSubstr("unknown flag -v"));
}

TEST(ParseFlags, SnakeCaseSpellingsAreRefusedWithTheKebabCaseOne) {
  auto a = Parse({"--dry_run"});
  ASSERT_FALSE(a.ok());
  EXPECT_THAT(a.status().message(), HasSubstr("did you mean --dry-run?"));
  auto b = Parse({"--max_reports", "3"});
  ASSERT_FALSE(b.ok());
  EXPECT_THAT(b.status().message(), HasSubstr("did you mean --max-reports?"));
  auto c = Parse({"--no_such_flag"});
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("--kebab-case"));
}

TEST(ParseFlags, FormerSpellingsPointAtTheirReplacement) {
  auto a = Parse({"--timeout_s", "30"});
  ASSERT_FALSE(a.ok());
  EXPECT_THAT(a.status().message(), HasSubstr("--timeout_s is now --timeout DURATION"));
  auto b = Parse({"--memory_budget_bytes=5"});
  ASSERT_FALSE(b.ok());
  EXPECT_THAT(b.status().message(), HasSubstr("is now --memory-budget SIZE"));
}

TEST(ParseFlags, HelpAndDoubleDash) {
  auto a = Parse({"-h"});
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(a->help);
  auto b = Parse({"--", "--dry-run", "-x"});
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->positional, (std::vector<std::string>{"--dry-run", "-x"}));
  EXPECT_FALSE(b->Has("dry-run"));
}

TEST(FlagConversions, SizesDurationsAndIntegersNameTheFlagWhenTheyDoNotConvert) {
  auto a = Parse({"--memory-budget", "1.5KiB", "--timeout", "1m30s", "--max-reports", "12"});
  ASSERT_TRUE(a.ok()) << a.status();
  int64_t bytes = 0, reports = 0;
  absl::Duration timeout;
  ASSERT_TRUE(SizeFlag(*a, "memory-budget", 1, &bytes).ok());
  EXPECT_EQ(bytes, 1536);
  ASSERT_TRUE(DurationFlag(*a, "timeout", &timeout).ok());
  EXPECT_EQ(timeout, absl::Seconds(90));
  ASSERT_TRUE(IntFlag(*a, "max-reports", 0, 100, &reports).ok());
  EXPECT_EQ(reports, 12);

  auto bad = Parse({"--memory-budget", "lots", "--timeout", "30", "--max-reports", "-1"});
  ASSERT_TRUE(bad.ok()) << bad.status();
  EXPECT_THAT(SizeFlag(*bad, "memory-budget", 1, &bytes).message(),
              HasSubstr("bad --memory-budget \"lots\""));
  // A bare number has no unit: refused rather than guessed.
  EXPECT_THAT(DurationFlag(*bad, "timeout", &timeout).message(), HasSubstr("bad --timeout \"30\""));
  EXPECT_THAT(IntFlag(*bad, "max-reports", 0, 100, &reports).message(),
              HasSubstr("bad --max-reports \"-1\""));
  EXPECT_EQ(bytes, 1536);  // untouched by failures
  EXPECT_EQ(reports, 12);

  auto absent = Parse({});
  ASSERT_TRUE(absent.ok());
  EXPECT_TRUE(SizeFlag(*absent, "memory-budget", 1, &bytes).ok());
  EXPECT_EQ(bytes, 1536);
}

TEST(ParseSize, DecimalAndBinaryUnitsInAnyCase) {
  int64_t v = 0;
  EXPECT_TRUE(ParseSize("5GB", &v));
  EXPECT_EQ(v, 5'000'000'000);
  EXPECT_TRUE(ParseSize("2gib", &v));
  EXPECT_EQ(v, int64_t{2} << 30);
  EXPECT_TRUE(ParseSize("1T", &v));
  EXPECT_EQ(v, int64_t{1} << 40);
  EXPECT_TRUE(ParseSize("64k", &v));
  EXPECT_EQ(v, 65536);
  EXPECT_FALSE(ParseSize("0", &v));
  EXPECT_FALSE(ParseSize("-5M", &v));
  EXPECT_FALSE(ParseSize("nanGB", &v));
  EXPECT_FALSE(ParseSize("1e30", &v));
}

// Every subcommand's table is kebab-case without repeats, its --help lists every flag, and it
// refuses a flag it lacks and the snake_case spelling of each flag it has.
TEST(AllCommands, HelpListsEveryFlagOfTheTableAndSnakeCaseIsRefused) {
  ASSERT_GE(AllCommands().size(), 12u);
  for (const Command& c : AllCommands()) {
    SCOPED_TRACE(c.name);
    const CommandSpec& spec = c.spec();
    EXPECT_EQ(spec.name, c.name);
    std::set<std::string> names;
    for (const FlagSpec& f : spec.flags) {
      EXPECT_TRUE(names.insert(f.name).second) << "repeated --" << f.name;
      for (char ch : f.name) {
        EXPECT_TRUE((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '-')
            << "--" << f.name << " is not kebab-case";
      }
    }

    testing::internal::CaptureStdout();
    const int help_code = c.run({c.name, "--help"});
    const std::string help = testing::internal::GetCapturedStdout();
    EXPECT_EQ(help_code, 0);
    EXPECT_THAT(help, HasSubstr(absl::StrCat("ckptctl ", c.name)));
    for (const FlagSpec& f : spec.flags) {
      EXPECT_THAT(help, HasSubstr(absl::StrCat("  --", f.name, f.value_name.empty() ? "" : " ",
                                               f.value_name)));
    }

    testing::internal::CaptureStderr();
    EXPECT_EQ(c.run({c.name, "--no-such-flag"}), 2);
    EXPECT_THAT(testing::internal::GetCapturedStderr(), HasSubstr("unknown flag --no-such-flag"));
    for (const FlagSpec& f : spec.flags) {
      if (f.name.find('-') == std::string::npos) continue;
      const std::string snake = absl::StrReplaceAll(f.name, {{"-", "_"}});
      testing::internal::CaptureStderr();
      EXPECT_EQ(c.run({c.name, absl::StrCat("--", snake, "=1")}), 2) << snake;
      EXPECT_THAT(testing::internal::GetCapturedStderr(),
                  HasSubstr(absl::StrCat("did you mean --", f.name, "?")));
    }
  }
}

}  // namespace
}  // namespace ckpt::ckptctl
