// The worker's unix socket for its trainers. The worker accepts connections itself, so that
// it knows who is on the other end of each one from the kernel (SO_PEERCRED: pid, uid, gid)
// rather than from what the trainer says, and hands every accepted connection to the gRPC
// server (grpc::AddInsecureChannelFromFd). A call's handler asks CallerOf(context) for the
// credentials of the connection it arrived on.
//
// The socket file is created with mode 0600 whatever the umask (0666 when other uids are
// allowed: their trainers are then judged by uid alone); a trainer whose uid is neither the
// worker's nor allowed is refused. Opening never removes a file that is not a socket, nor a
// socket that another process still serves.
#ifndef CKPT_WORKER_TRAINER_SOCKET_H_
#define CKPT_WORKER_TRAINER_SOCKET_H_

#include <grpcpp/grpcpp.h>
#include <sys/types.h>

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace ckpt::worker {

// Who is connected, as the kernel saw it when the trainer connected.
struct TrainerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};

// The listening socket. Thread-safe.
class TrainerSocket {
 public:
  struct Options {
    std::string path;                 // the socket file (at most 107 bytes)
    std::vector<uid_t> allowed_uids;  // trainers' uids accepted besides this process's
  };

  // Binds and listens on options.path: a stale socket (nobody accepts on it) is replaced; a
  // path that is not a socket, or a socket still served, is FailedPrecondition naming it.
  static absl::StatusOr<std::unique_ptr<TrainerSocket>> Open(Options options);
  ~TrainerSocket();
  TrainerSocket(const TrainerSocket&) = delete;
  TrainerSocket& operator=(const TrainerSocket&) = delete;

  // Starts accepting on a thread; every connection is handed to `server` (which must outlive
  // Stop()).
  void Serve(grpc::Server* server);
  // Stops accepting and removes the socket file (existing connections live on).
  void Stop();

  // The credentials of the connection behind `context`: PermissionDenied naming the uid when
  // it is neither this process's nor allowed; Internal when the connection is unknown.
  absl::StatusOr<TrainerCredentials> CallerOf(const grpc::ServerContext& context) const;

  const std::string& path() const { return options_.path; }

 private:
  TrainerSocket(Options options, int listen_fd, int stop_fd);
  void AcceptLoop(grpc::Server* server);

  Options options_;
  int listen_fd_ = -1;
  int stop_fd_ = -1;  // eventfd that wakes the accept loop
  std::thread acceptor_;
  mutable absl::Mutex mu_;
  // By the connection's file descriptor number (gRPC names such peers "fd:<n>").
  std::map<int, TrainerCredentials> connections_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace ckpt::worker

#endif  // CKPT_WORKER_TRAINER_SOCKET_H_
