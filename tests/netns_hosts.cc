#include "tests/netns_hosts.h"

#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"

namespace ckpt::testing {
namespace {

constexpr char kPrefix[] = "ckmh";

// ip(8) by absolute path: a test's PATH usually lacks /sbin.
std::string Ip() {
  for (const char* path : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
    if (access(path, X_OK) == 0) return path;
  }
  return "";
}

std::string Tc() {
  for (const char* path : {"/usr/sbin/tc", "/sbin/tc", "/usr/bin/tc", "/bin/tc"}) {
    if (access(path, X_OK) == 0) return path;
  }
  return "";
}

// Output of `command` (stdout and stderr); `code` its exit status.
std::string Capture(const std::string& command, int* code) {
  std::string out;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) {
    *code = -1;
    return "popen failed";
  }
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
  int status = pclose(pipe);
  *code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

// Whether the run that made names with prefix "ckmh<pid>" is gone.
bool OwnerGone(absl::string_view name) {
  if (!absl::ConsumePrefix(&name, kPrefix)) return false;
  const size_t digits = name.find_first_not_of("0123456789");
  int64_t pid = 0;
  if (!absl::SimpleAtoi(name.substr(0, digits), &pid) || pid <= 0) return false;
  return pid != getpid() && kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
}

// First whitespace-separated word of each line of `text` (an `ip netns list` / `ip -o link`
// listing; link names lose their ":" and "@peer" suffixes).
std::set<std::string> Names(const std::string& text, bool links) {
  std::set<std::string> names;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    std::vector<std::string> words = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (words.empty()) continue;
    std::string name = words[links && words.size() > 1 ? 1 : 0];
    name = name.substr(0, name.find_first_of(":@"));
    names.insert(name);
  }
  return names;
}

}  // namespace

absl::Status RunShell(const std::string& command) {
  int code = 0;
  std::string out = Capture(command, &code);
  if (code == 0) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("`", command, "` exited with ", code, ": ", out));
}

std::string NetnsHosts::Unavailable() {
  if (geteuid() != 0) return "network namespaces need root (CAP_NET_ADMIN and CAP_SYS_ADMIN)";
  if (Ip().empty()) return "ip(8) is not installed (Debian package iproute2)";
  const std::string probe = absl::StrCat(kPrefix, getpid(), "probe");
  absl::Status made = RunShell(absl::StrCat(Ip(), " netns add ", probe));
  if (!made.ok()) return absl::StrCat("cannot make a network namespace: ", made.message());
  (void)RunShell(absl::StrCat(Ip(), " netns delete ", probe));
  return "";
}

void NetnsHosts::SweepStale() {
  const std::string ip = Ip();
  if (ip.empty()) return;
  int code = 0;
  for (const std::string& ns : Names(Capture(ip + " netns list", &code), false)) {
    if (OwnerGone(ns)) (void)RunShell(absl::StrCat(ip, " netns delete ", ns));
  }
  for (const std::string& link : Names(Capture(ip + " -o link show", &code), true)) {
    if (OwnerGone(link)) (void)RunShell(absl::StrCat(ip, " link delete ", link));
  }
}

absl::StatusOr<std::unique_ptr<NetnsHosts>> NetnsHosts::Create(int hosts) {
  if (hosts < 1 || hosts > 26) return absl::InvalidArgumentError("1 to 26 hosts");
  if (std::string why = Unavailable(); !why.empty()) return absl::UnavailableError(why);
  SweepStale();
  std::unique_ptr<NetnsHosts> made(new NetnsHosts());
  absl::Status built = made->Build(hosts);
  if (!built.ok()) return built;  // the destructor removes what was made so far
  return made;
}

absl::Status NetnsHosts::Build(int hosts) {
  const std::string ip = Ip();
  prefix_ = absl::StrCat(kPrefix, getpid());
  // A /24 of 10.0.0.0/8 from the pid; the next one when something already routes it.
  std::string subnet;
  for (int attempt = 0; attempt < 64 && subnet.empty(); ++attempt) {
    const int n = static_cast<int>(getpid()) + attempt * 7919;
    const std::string candidate = absl::StrCat("10.", 100 + (n / 256) % 150, ".", n % 256, ".");
    int code = 0;
    std::string routes =
        Capture(absl::StrCat(ip, " -4 route show to match ", candidate, "1"), &code);
    // Only the default route (or nothing) may cover it.
    bool used = false;
    for (absl::string_view line : absl::StrSplit(routes, '\n', absl::SkipEmpty())) {
      used = used || !absl::StartsWith(line, "default");
    }
    if (code == 0 && !used) subnet = candidate;
  }
  if (subnet.empty()) return absl::UnavailableError("no free 10.x.y.0/24 for the test network");
  bridge_ = prefix_ + "br";
  if (absl::Status s = RunShell(absl::StrCat(ip, " link add ", bridge_, " type bridge")); !s.ok()) {
    bridge_.clear();
    return s;
  }
  std::vector<std::string> steps = {absl::StrCat(ip, " addr add ", subnet, "254/24 dev ", bridge_),
                                    absl::StrCat(ip, " link set ", bridge_, " up")};
  for (int i = 0; i < hosts; ++i) {
    Host h;
    h.name = absl::StrCat("host", std::string(1, static_cast<char>('A' + i)));
    h.netns = absl::StrCat(prefix_, "h", i);
    h.bridge_end = absl::StrCat(prefix_, "v", i);
    h.address = absl::StrCat(subnet, i + 1);
    const std::string peer = absl::StrCat(prefix_, "p", i), in_ns = ip + " -n " + h.netns;
    hosts_.push_back(h);
    for (std::string step : {
             absl::StrCat(ip, " netns add ", h.netns),
             absl::StrCat(ip, " link add ", h.bridge_end, " type veth peer name ", peer, " netns ",
                          h.netns),
             absl::StrCat(ip, " link set ", h.bridge_end, " master ", bridge_, " up"),
             absl::StrCat(in_ns, " link set ", peer, " name eth0"),
             absl::StrCat(in_ns, " addr add ", h.address, "/24 dev eth0"),
             absl::StrCat(in_ns, " link set eth0 up"),
             absl::StrCat(in_ns, " link set lo up"),
         }) {
      steps.push_back(step);
    }
  }
  for (const std::string& step : steps) {
    if (absl::Status s = RunShell(step); !s.ok()) return s;
  }
  return absl::OkStatus();
}

NetnsHosts::~NetnsHosts() {
  const std::string ip = Ip();
  // Deleting a namespace destroys its eth0 and with it the veth's other end.
  for (const Host& h : hosts_) {
    (void)RunShell(absl::StrCat(ip, " netns delete ", h.netns));
    (void)RunShell(absl::StrCat(ip, " link delete ", h.bridge_end, " 2>/dev/null || true"));
  }
  if (!bridge_.empty()) (void)RunShell(absl::StrCat(ip, " link delete ", bridge_));
}

absl::Status NetnsHosts::CutLink(int i) {
  return RunShell(absl::StrCat(Ip(), " link set ", hosts_.at(i).bridge_end, " down"));
}

absl::StatusOr<std::vector<std::string>> NetnsHosts::TcpPeers(int i) const {
  int code = 0;
  const std::string out = Capture(
      absl::StrCat(Ip(), " netns exec ", hosts_.at(i).netns, " ss -Htn state established"), &code);
  if (code != 0) return absl::InternalError(absl::StrCat("ss failed: ", out));
  // Columns (with a state filter): Recv-Q Send-Q Local:Port Peer:Port.
  std::vector<std::string> peers;
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
    std::vector<std::string> words = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (words.size() >= 4) peers.push_back(words[3]);
  }
  return peers;
}

absl::Status NetnsHosts::Shape(int i, const std::string& rate) {
  if (Tc().empty()) return absl::UnavailableError("tc(8) is not installed (iproute2)");
  // A token bucket (tbf: in every kernel, unlike netem's module) at both ends of the link.
  const std::string qdisc = absl::StrCat(" root tbf rate ", rate, " burst 32kbit latency 2s");
  CKPT_RETURN_IF_ERROR(
      RunShell(absl::StrCat(Tc(), " qdisc replace dev ", hosts_.at(i).bridge_end, qdisc)));
  return RunShell(absl::StrCat(Ip(), " netns exec ", hosts_.at(i).netns, " ", Tc(),
                               " qdisc replace dev eth0", qdisc));
}

}  // namespace ckpt::testing
