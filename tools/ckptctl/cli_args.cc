#include "tools/ckptctl/cli_args.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"

namespace ckpt::ckptctl {
namespace {

const FlagSpec* FindFlag(const CommandSpec& spec, const std::string& name) {
  for (const FlagSpec& f : spec.flags) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

// The error for a name the table lacks: a former spelling or a snake_case one points at the
// flag to use.
absl::Status UnknownFlag(const CommandSpec& spec, const std::string& name) {
  for (const FlagSpec& f : spec.flags) {
    if (!f.formerly.empty() && f.formerly == name) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--", name, " is now --", f.name, f.value_name.empty() ? "" : " ", f.value_name));
    }
  }
  const std::string kebab = absl::StrReplaceAll(name, {{"_", "-"}});
  if (kebab != name) {
    const std::string hint = FindFlag(spec, kebab) != nullptr
                                 ? absl::StrCat("; did you mean --", kebab, "?")
                                 : std::string();
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown flag --", name, " (ckptctl flags are spelled --kebab-case", hint, ")"));
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
}

}  // namespace

std::string ParsedArgs::Get(const std::string& name, const std::string& fallback) const {
  auto it = flags.find(name);
  return it == flags.end() ? fallback : it->second;
}

absl::StatusOr<ParsedArgs> ParseFlags(const CommandSpec& spec,
                                      const std::vector<std::string>& args) {
  ParsedArgs out;
  bool flags_ended = false;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (flags_ended || arg.size() < 2 || arg[0] != '-') {
      out.positional.push_back(arg);
      continue;
    }
    if (arg == "--") {
      flags_ended = true;
      continue;
    }
    if (arg == "-h" || arg == "--help") {
      out.help = true;
      continue;
    }
    if (arg.rfind("--", 0) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag ", arg, " (flags are spelled --name)"));
    }
    std::string name = arg.substr(2);
    std::optional<std::string> value;
    if (const size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name.resize(eq);
    }
    const FlagSpec* flag = FindFlag(spec, name);
    if (flag == nullptr) return UnknownFlag(spec, name);
    if (flag->value_name.empty()) {
      if (value.has_value()) {
        return absl::InvalidArgumentError(absl::StrCat("--", name, " takes no value"));
      }
      out.flags[name] = "1";
      continue;
    }
    if (!value.has_value()) {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", name, " needs a value (", flag->value_name, ")"));
      }
      value = args[++i];
    }
    out.flags[name] = *value;
  }
  return out;
}

std::string HelpText(const CommandSpec& spec) {
  std::string text = spec.synopsis;
  if (!text.empty() && text.back() != '\n') text += '\n';
  if (!spec.description.empty()) absl::StrAppend(&text, "\n", spec.description);
  if (!text.empty() && text.back() != '\n') text += '\n';
  text += "\nflags:\n";
  std::vector<FlagSpec> flags = spec.flags;
  flags.push_back({"help", "", "print this help"});
  for (const FlagSpec& f : flags) {
    std::string head = absl::StrCat("  --", f.name);
    if (!f.value_name.empty()) absl::StrAppend(&head, " ", f.value_name);
    const std::vector<std::string> lines = absl::StrSplit(f.help, '\n');
    constexpr size_t kColumn = 28;
    for (size_t i = 0; i < lines.size(); ++i) {
      std::string left = i == 0 ? head : "";
      if (left.size() + 2 > kColumn) {
        absl::StrAppend(&text, left, "\n");
        left.clear();
      }
      absl::StrAppend(&text, left, std::string(kColumn - left.size(), ' '), lines[i], "\n");
    }
  }
  return text;
}

std::optional<int> ParseCommandLine(const CommandSpec& spec, const std::vector<std::string>& args,
                                    ParsedArgs* out) {
  absl::StatusOr<ParsedArgs> parsed = ParseFlags(spec, args);
  // --help wins over other problems on the line, so that it always shows the flags.
  const bool help =
      std::find(args.begin() + (args.empty() ? 0 : 1), args.end(), "--help") != args.end() ||
      (parsed.ok() && parsed->help);
  if (help) {
    std::fputs(HelpText(spec).c_str(), stdout);
    return 0;
  }
  if (!parsed.ok()) return Usage(spec.name, std::string(parsed.status().message()));
  *out = *std::move(parsed);
  return std::nullopt;
}

int Usage(const std::string& cmd, const std::string& msg) {
  std::fprintf(stderr, "ckptctl %s: %s (see ckptctl %s --help)\n", cmd.c_str(), msg.c_str(),
               cmd.c_str());
  return 2;
}

int Fail(const std::string& cmd, const absl::Status& s) {
  std::fprintf(stderr, "ckptctl %s: %s\n", cmd.c_str(), std::string(s.message()).c_str());
  return 1;
}

bool ParseSize(const std::string& text, int64_t* out) {
  static const std::vector<std::pair<std::string, double>> kUnits = {
      {"KIB", 1024.0}, {"MIB", 1048576.0}, {"GIB", 1073741824.0}, {"TIB", 1099511627776.0},
      {"KB", 1e3},     {"MB", 1e6},        {"GB", 1e9},           {"TB", 1e12},
      {"K", 1024.0},   {"M", 1048576.0},   {"G", 1073741824.0},   {"T", 1099511627776.0},
      {"B", 1.0}};
  double mult = 1.0;
  std::string num = absl::AsciiStrToUpper(text);
  for (const auto& [suffix, m] : kUnits) {
    if (num.size() > suffix.size() &&
        num.compare(num.size() - suffix.size(), suffix.size(), suffix) == 0) {
      num.resize(num.size() - suffix.size());
      mult = m;
      break;
    }
  }
  double v;
  if (!absl::SimpleAtod(num, &v) || !std::isfinite(v) || v <= 0 || v * mult > 9e18) return false;
  *out = static_cast<int64_t>(v * mult);
  return true;
}

absl::Status SizeFlag(const ParsedArgs& a, const std::string& name, int64_t min, int64_t* out) {
  if (!a.Has(name)) return absl::OkStatus();
  int64_t v;
  if (!ParseSize(a.Get(name), &v) || v < min) {
    return absl::InvalidArgumentError(absl::StrCat("bad --", name, " \"", a.Get(name),
                                                   "\" (a size such as 512MiB or 4GB, at least ",
                                                   min, " bytes)"));
  }
  *out = v;
  return absl::OkStatus();
}

absl::Status IntFlag(const ParsedArgs& a, const std::string& name, int64_t min, int64_t max,
                     int64_t* out) {
  if (!a.Has(name)) return absl::OkStatus();
  int64_t v;
  if (!absl::SimpleAtoi(a.Get(name), &v) || v < min || v > max) {
    return absl::InvalidArgumentError(absl::StrCat("bad --", name, " \"", a.Get(name),
                                                   "\" (an integer in [", min, ", ", max, "])"));
  }
  *out = v;
  return absl::OkStatus();
}

absl::Status IntFlag(const ParsedArgs& a, const std::string& name, int min, int max, int* out) {
  int64_t v = *out;
  if (absl::Status s = IntFlag(a, name, int64_t{min}, int64_t{max}, &v); !s.ok()) return s;
  *out = static_cast<int>(v);
  return absl::OkStatus();
}

absl::Status DurationFlag(const ParsedArgs& a, const std::string& name, absl::Duration* out) {
  if (!a.Has(name)) return absl::OkStatus();
  absl::Duration d;
  const std::string text = a.Get(name);
  // absl::ParseDuration takes "0" and "inf" too; a bare number has no unit to read it in.
  if (!absl::ParseDuration(text, &d) || d <= absl::ZeroDuration() ||
      d == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad --", name, " \"", text, "\" (a positive duration with its unit: 30s, 500ms, 2m, 1h)"));
  }
  *out = d;
  return absl::OkStatus();
}

absl::Status RefuseFlags(const ParsedArgs& a, const std::vector<std::string>& names,
                         const std::string& applies) {
  for (const std::string& name : names) {
    if (a.Has(name)) return absl::InvalidArgumentError(absl::StrCat("--", name, " ", applies));
  }
  return absl::OkStatus();
}

const std::vector<FlagSpec>& IoFlagSpecs() {
  static const std::vector<FlagSpec>* flags = new std::vector<FlagSpec>{
      {"threads", "N", "I/O threads, 1..256 (default 4)"},
      {"direct-io", "", "O_DIRECT reads and writes (where the filesystem allows)", "direct"},
      {"no-uring", "", "plain pread/pwrite instead of io_uring"},
  };
  return *flags;
}

absl::Status IoFromFlags(const ParsedArgs& a, IoOptions* io) {
  int threads = io->num_threads;
  if (absl::Status s = IntFlag(a, "threads", 1, 256, &threads); !s.ok()) return s;
  io->num_threads = threads;
  if (a.Has("direct-io")) io->direct_io = true;
  if (a.Has("no-uring")) io->backend = IoBackend::kPosix;
  return absl::OkStatus();
}

std::vector<FlagSpec> With(std::vector<FlagSpec> a, const std::vector<FlagSpec>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::string HumanBytes(int64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return u == 0 ? absl::StrCat(b, " B") : absl::StrFormat("%.2f %s", v, units[u]);
}

}  // namespace ckpt::ckptctl
