// Hosts for the multi-host tests: Linux network namespaces, one per host, each with its own
// eth0 (one end of a veth pair) on a bridge in this process's namespace, addresses in a /24 of
// 10.0.0.0/8 picked per run (the bridge holds .254, so this process reaches every host; host i
// holds .(i+1)). Nothing else is routed: only these addresses and loopback are used.
//
// Every name starts with "ckmh<pid>", the creating process's id: the destructor removes what
// it made (namespaces, links, the bridge), and Create first removes what earlier runs killed
// before their destructor (a dead pid in the prefix) left behind. Needs root (CAP_NET_ADMIN,
// CAP_SYS_ADMIN) and ip(8); Unavailable() says why not otherwise.
#ifndef CKPT_TESTS_NETNS_HOSTS_H_
#define CKPT_TESTS_NETNS_HOSTS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ckpt::testing {

// Hosts as network namespaces joined by a bridge (see the file comment).
class NetnsHosts {
 public:
  // Why namespaces cannot be made on this machine ("" when they can).
  static std::string Unavailable();
  // Removes namespaces and links of earlier runs whose process is gone.
  static void SweepStale();
  // Makes `hosts` namespaces (host names "hostA", "hostB", ...) and their links.
  static absl::StatusOr<std::unique_ptr<NetnsHosts>> Create(int hosts);
  ~NetnsHosts();
  NetnsHosts(const NetnsHosts&) = delete;
  NetnsHosts& operator=(const NetnsHosts&) = delete;

  int size() const { return static_cast<int>(hosts_.size()); }
  // The namespace's name under /var/run/netns (for Cluster::set_network_namespace).
  const std::string& netns(int i) const { return hosts_.at(i).netns; }
  // The name the host's workers announce (--host): "hostA", "hostB", ...
  const std::string& name(int i) const { return hosts_.at(i).name; }
  // The host's address on the bridge (its eth0), e.g. "10.123.45.2".
  const std::string& address(int i) const { return hosts_.at(i).address; }

  // Takes host i's link down at the bridge (its end in this namespace): from now on nothing
  // reaches the host and nothing leaves it, and no packet says so (no RST, no ICMP).
  absl::Status CutLink(int i);
  // The peers ("address:port") of host i's established TCP connections, as ss(8) lists them.
  absl::StatusOr<std::vector<std::string>> TcpPeers(int i) const;
  // Limits host i's link to `rate` (tc's syntax, e.g. "8mbit") in both directions.
  absl::Status Shape(int i, const std::string& rate);

 private:
  struct Host {
    std::string name, netns, bridge_end, address;
  };
  NetnsHosts() = default;
  absl::Status Build(int hosts);

  std::string prefix_;  // "ckmh<pid>"
  std::string bridge_;
  std::vector<Host> hosts_;
};

// Runs `command` with /bin/sh; its output (stdout and stderr) in the error when it fails.
absl::Status RunShell(const std::string& command);

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_NETNS_HOSTS_H_
