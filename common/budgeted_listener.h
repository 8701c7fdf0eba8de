// A daemon's TCP listening socket, accepted by the daemon itself and handed to its gRPC server
// (grpc::experimental::ExternalConnectionAcceptor, which keeps the server's credentials: TLS
// works as with AddListeningPort). gRPC 1.51's own listener stops accepting for good after any
// accept4 error other than EAGAIN/ECONNABORTED (src/core/lib/iomgr/tcp_server_posix.cc, on_read:
// "goto error" without re-arming), so a flood that ran the process out of descriptors left the
// coordinator deaf while its listen queue grew. This one:
//  - keeps a connection budget (common/connection_budget.h): a total and a per-peer-address cap;
//    a peer over its cap is refused at once, and when the total is spent a lighter peer's
//    newcomer takes the place of the heaviest peer's oldest connection (shut down);
//  - never gives up on EMFILE/ENFILE: it closes a reserve descriptor to accept the waiting
//    connection (admitted under the same rules as a full budget), and backs off briefly while
//    no reserve can be had;
//  - notices connections gRPC has closed (their descriptor gone or reused) by a sweep once a
//    second and whenever the budget looks spent.
// Idle connections are shed by gRPC itself (MaxConnectionIdle, handshake timeout; see
// ConnectionSettings below and docs/services.md, "Connection budget").
#ifndef CKPT_COMMON_BUDGETED_LISTENER_H_
#define CKPT_COMMON_BUDGETED_LISTENER_H_

#include <grpcpp/grpcpp.h>
#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/connection_budget.h"

namespace ckpt {

// What a daemon's --max_connections* and idle flags ask for.
struct ConnectionSettings {
  int64_t max_connections = 0;  // 0: the open-files limit less a reserve for files
  int64_t max_connections_per_peer = 1024;
  int64_t idle_ms = 0;                     // GRPC_ARG_MAX_CONNECTION_IDLE_MS (0: gRPC's default)
  int64_t handshake_timeout_ms = 0;        // GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS (0: gRPC's)
  int64_t max_streams_per_connection = 0;  // GRPC_ARG_MAX_CONCURRENT_STREAMS (0: gRPC's)
};

// The total budget max_connections = 0 stands for, given the open-files limit in force.
int64_t DefaultMaxConnections(int64_t open_files_limit);

// Applies the idle, handshake and stream settings to `builder`.
void ApplyConnectionSettings(const ConnectionSettings& settings, grpc::ServerBuilder* builder);

class BudgetedListener {
 public:
  // Binds and listens on "host:port" (port 0: the OS picks; "0.0.0.0", "::" or "[::]": every
  // address, IPv4 and IPv6). InvalidArgument for a malformed address, Unavailable naming it when
  // it cannot be bound.
  static absl::StatusOr<std::unique_ptr<BudgetedListener>> Open(const std::string& address,
                                                                ConnectionBudget::Limits limits);
  ~BudgetedListener();
  BudgetedListener(const BudgetedListener&) = delete;
  BudgetedListener& operator=(const BudgetedListener&) = delete;

  int port() const { return port_; }
  const ConnectionBudget::Limits& limits() const { return limits_; }

  // Starts accepting on a thread; admitted connections go to `acceptor` (from
  // ServerBuilder::experimental().AddExternalConnectionAcceptor; the server must be started).
  void Serve(std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor);
  // Stops accepting and closes the socket (connections handed over live on). Call before the
  // server shuts down: gRPC leaks a connection handed to a stopped server.
  void Stop();

 private:
  BudgetedListener(int listen_fd, int stop_fd, int port, ConnectionBudget::Limits limits);
  void AcceptLoop();
  // Accepts what is waiting; false when out of descriptors with no reserve (back off).
  bool AcceptReady();
  void Admit(int fd, const std::string& peer, bool out_of_descriptors);
  // Forgets connections whose descriptor gRPC has closed (at most every 100 ms unless forced).
  void Sweep(bool force);

  const int listen_fd_;
  const int stop_fd_;  // eventfd that wakes the accept loop
  const int port_;
  const ConnectionBudget::Limits limits_;
  int reserve_fd_ = -1;  // /dev/null, given up to accept under EMFILE
  std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor_;
  std::thread thread_;
  absl::Mutex mu_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  // Accept-loop thread only from here on.
  ConnectionBudget budget_;
  std::map<int, ino_t> inodes_;  // each counted descriptor's socket inode
  int64_t last_sweep_ms_ = 0;
  int64_t refused_ = 0;
  int64_t evicted_ = 0;
};

}  // namespace ckpt

#endif  // CKPT_COMMON_BUDGETED_LISTENER_H_
