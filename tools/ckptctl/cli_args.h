// Command-line helpers shared by ckptctl's offline checkpoint commands (inspect, verify,
// import, export, diff): "--flag" / "--flag=value" / "--flag value" parsing, sizes such as
// "5GB", the I/O flags, byte counts for humans.
#ifndef CKPT_TOOLS_CKPTCTL_CLI_ARGS_H_
#define CKPT_TOOLS_CKPTCTL_CLI_ARGS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "storage/io_engine.h"

namespace ckpt::ckptctl {

// Parsed "--flag", "--flag=value" / "--flag value" options and positional arguments.
struct Args {
  std::vector<std::string> positional;
  std::map<std::string, std::string> flags;
  std::string error;  // the first problem, or empty
};

// Parses args[1..] (args[0] is the subcommand): flags named in `bool_flags` take no value,
// those in `value_flags` take one; any other "--x" is an error.
Args ParseArgs(const std::vector<std::string>& args, const std::vector<std::string>& bool_flags,
               const std::vector<std::string>& value_flags);

// "ckptctl <cmd>: <msg> (see ckptctl <cmd> --help)" on stderr; returns 2.
int Usage(const std::string& cmd, const std::string& msg);
// "ckptctl <cmd>: <status message>" on stderr; returns 1.
int Fail(const std::string& cmd, const absl::Status& s);

// "123", "64KiB", "5MB", "2GiB", "1.5GB" -> bytes (> 0).
bool ParseSize(const std::string& text, int64_t* out);

// I/O options from --threads N, --direct, --no-uring.
bool IoFromFlags(const Args& a, IoOptions* io, std::string* err);
extern const std::vector<std::string> kIoValueFlags;  // threads
extern const std::vector<std::string> kIoBoolFlags;   // direct, no-uring, help

// a followed by b.
std::vector<std::string> With(std::vector<std::string> a, const std::vector<std::string>& b);

// "512 B", "1.50 KiB", "3.20 GiB".
std::string HumanBytes(int64_t b);

}  // namespace ckpt::ckptctl

#endif  // CKPT_TOOLS_CKPTCTL_CLI_ARGS_H_
