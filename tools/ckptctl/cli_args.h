// ckptctl's one command-line style: every subcommand declares its flags in a table (name in
// --kebab-case, value or bool, help line) and parses them with ParseCommandLine, which accepts
// "--flag value" and "--flag=value", refuses unknown flags by name and snake_case spellings
// with the kebab one to use, and prints the help (every flag of the table) for --help / -h.
// Also: value conversions every command shares (sizes "5GB", durations "30s", integers), the
// I/O flags, byte counts for humans.
#ifndef CKPT_TOOLS_CKPTCTL_CLI_ARGS_H_
#define CKPT_TOOLS_CKPTCTL_CLI_ARGS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "storage/io_engine.h"

namespace ckpt::ckptctl {

// One flag of a command: "--name" (kebab-case), with a value when `value_name` is not empty.
struct FlagSpec {
  FlagSpec(std::string name, std::string value_name, std::string help, std::string formerly = "")
      : name(std::move(name)),
        value_name(std::move(value_name)),
        help(std::move(help)),
        formerly(std::move(formerly)) {}

  std::string name;        // without the leading "--"
  std::string value_name;  // e.g. "SIZE", "FILE"; empty: a bool flag, which takes no value
  std::string help;        // one or more lines, shown after the name in --help
  std::string formerly;    // an older spelling (e.g. "timeout_s"), refused with a pointer here
};

// A command's flag table and the prose of its --help.
struct CommandSpec {
  std::string name;         // "reshard", "plan", ...
  std::string synopsis;     // the "usage: ..." line(s)
  std::string description;  // what the command does (paragraphs), before the flag list
  std::vector<FlagSpec> flags;
};

// The parsed command line: flags by name ("1" for bool flags) and positional arguments.
struct ParsedArgs {
  std::vector<std::string> positional;
  std::map<std::string, std::string> flags;
  bool help = false;  // --help or -h was given

  bool Has(const std::string& name) const { return flags.count(name) > 0; }
  // The flag's value, or `fallback` when it was not given.
  std::string Get(const std::string& name, const std::string& fallback = "") const;
};

// Parses args[1..] (args[0] is the subcommand) against `spec`. "--" ends the flags. Errors
// (InvalidArgument) name the flag: unknown, a snake_case or former spelling (saying which flag
// to use), a value given to a bool flag, a missing value.
absl::StatusOr<ParsedArgs> ParseFlags(const CommandSpec& spec,
                                      const std::vector<std::string>& args);

// The --help text: synopsis, description, then every flag of the table (and --help).
std::string HelpText(const CommandSpec& spec);

// The common start of every subcommand: parses; prints the help to stdout for --help (returns
// 0) or a usage error to stderr (returns 2); nullopt when the command should go on with *out.
std::optional<int> ParseCommandLine(const CommandSpec& spec, const std::vector<std::string>& args,
                                    ParsedArgs* out);

// "ckptctl <cmd>: <msg> (see ckptctl <cmd> --help)" on stderr; returns 2.
int Usage(const std::string& cmd, const std::string& msg);
// "ckptctl <cmd>: <status message>" on stderr; returns 1.
int Fail(const std::string& cmd, const absl::Status& s);

// "123", "64KiB", "5MB", "2GiB", "1.5GB", "1T" -> bytes (> 0). K/M/G/T and *iB are powers of
// 1024, KB/MB/GB/TB powers of 1000; case does not matter.
bool ParseSize(const std::string& text, int64_t* out);

// Flag conversions: each leaves *out alone when the flag is absent and returns a usage error
// naming the flag and its value when it does not convert.
// A size (ParseSize) of at least `min`.
absl::Status SizeFlag(const ParsedArgs& a, const std::string& name, int64_t min, int64_t* out);
// An integer in [min, max].
absl::Status IntFlag(const ParsedArgs& a, const std::string& name, int64_t min, int64_t max,
                     int64_t* out);
absl::Status IntFlag(const ParsedArgs& a, const std::string& name, int min, int max, int* out);
// A positive, finite duration with its unit: "30s", "500ms", "2m", "1h30m".
absl::Status DurationFlag(const ParsedArgs& a, const std::string& name, absl::Duration* out);

// InvalidArgument "--<name> <applies>" for the first of `names` that was given (flags that the
// form of the command being run does not take, e.g. applies = "applies only with --coordinator").
absl::Status RefuseFlags(const ParsedArgs& a, const std::vector<std::string>& names,
                         const std::string& applies);

// The I/O flags (--threads N, --direct-io, --no-uring) and their conversion.
const std::vector<FlagSpec>& IoFlagSpecs();
absl::Status IoFromFlags(const ParsedArgs& a, IoOptions* io);

// a followed by b.
std::vector<FlagSpec> With(std::vector<FlagSpec> a, const std::vector<FlagSpec>& b);

// "512 B", "1.50 KiB", "3.20 GiB".
std::string HumanBytes(int64_t b);

}  // namespace ckpt::ckptctl

#endif  // CKPT_TOOLS_CKPTCTL_CLI_ARGS_H_
