// ckptctl reshard --coordinator: a reshard executed on a cluster's worker daemons.
#ifndef CKPT_TOOLS_CKPTCTL_CLUSTER_RESHARD_H_
#define CKPT_TOOLS_CKPTCTL_CLUSTER_RESHARD_H_

#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "tools/ckptctl/coordinator_channel.h"

namespace ckpt::ckptctl {

// What the operator asked for.
struct ClusterReshardArgs {
  std::string coordinator;  // host:port
  TlsFlags tls;
  std::string source;
  std::string destination;
  std::string layout_path;  // read here, sent as JSON text
  bool overwrite = false;
  int64_t memory_budget_bytes = 0;          // per rank; 0: the coordinator's default
  int max_workers = 0;                      // 0: every live worker
  absl::Duration timeout = absl::Hours(1);  // of the wait; the reshard goes on after it
  bool json = false;
};

// Starts the reshard at the coordinator, shows progress until it is committed or aborted and
// prints a summary. Returns the process exit code (0 committed, 1 failed, 2 usage).
int RunClusterReshard(const ClusterReshardArgs& args);

}  // namespace ckpt::ckptctl

#endif  // CKPT_TOOLS_CKPTCTL_CLUSTER_RESHARD_H_
