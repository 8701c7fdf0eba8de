#include "tools/ckptctl/cli_args.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ckpt::ckptctl {

Args ParseArgs(const std::vector<std::string>& args, const std::vector<std::string>& bool_flags,
               const std::vector<std::string>& value_flags) {
  Args out;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("--", 0) != 0 || a == "--") {
      out.positional.push_back(a);
      continue;
    }
    std::string name = a.substr(2), value;
    const size_t eq = name.find('=');
    const bool has_value = eq != std::string::npos;
    if (has_value) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    if (std::find(bool_flags.begin(), bool_flags.end(), name) != bool_flags.end()) {
      if (has_value) out.error = absl::StrCat("--", name, " takes no value");
      out.flags[name] = "1";
    } else if (std::find(value_flags.begin(), value_flags.end(), name) != value_flags.end()) {
      if (!has_value) {
        if (i + 1 >= args.size()) {
          out.error = absl::StrCat("--", name, " needs a value");
          break;
        }
        value = args[++i];
      }
      out.flags[name] = value;
    } else {
      out.error = absl::StrCat("unknown option ", a);
      break;
    }
  }
  return out;
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

// "123", "64KiB", "5MB", "2GiB", "1.5GB" -> bytes.
bool ParseSize(const std::string& text, int64_t* out) {
  static const std::vector<std::pair<std::string, double>> kUnits = {
      {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0},
      {"KB", 1e3},     {"MB", 1e6},        {"GB", 1e9},           {"TB", 1e12},
      {"K", 1024.0},   {"M", 1048576.0},   {"G", 1073741824.0},   {"B", 1.0}};
  double mult = 1.0;
  std::string num = text;
  for (const auto& [suffix, m] : kUnits) {
    if (num.size() > suffix.size() &&
        num.compare(num.size() - suffix.size(), suffix.size(), suffix) == 0) {
      num = num.substr(0, num.size() - suffix.size());
      mult = m;
      break;
    }
  }
  double v;
  if (!absl::SimpleAtod(num, &v) || v <= 0 || v * mult > 9e18) return false;
  *out = static_cast<int64_t>(v * mult);
  return true;
}

// I/O options from --threads N, --direct, --no-uring.
bool IoFromFlags(const Args& a, IoOptions* io, std::string* err) {
  if (a.flags.count("threads")) {
    int n;
    if (!absl::SimpleAtoi(a.flags.at("threads"), &n) || n < 1 || n > 256) {
      *err = "--threads must be an integer in [1, 256]";
      return false;
    }
    io->num_threads = n;
  }
  io->direct_io = a.flags.count("direct") > 0;
  if (a.flags.count("no-uring")) io->backend = IoBackend::kPosix;
  return true;
}

const std::vector<std::string> kIoValueFlags = {"threads"};
const std::vector<std::string> kIoBoolFlags = {"direct", "no-uring", "help"};

std::vector<std::string> With(std::vector<std::string> a, const std::vector<std::string>& b) {
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
