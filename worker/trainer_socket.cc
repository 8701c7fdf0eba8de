#include "worker/trainer_socket.h"

#include <grpcpp/server_posix.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace ckpt::worker {
namespace {

absl::Status Errno(absl::string_view what, const std::string& path) {
  return absl::FailedPreconditionError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

// Whether a process accepts connections on the unix socket at `address`.
bool SomeoneServes(const sockaddr_un& address) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  bool served = connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) == 0;
  close(fd);
  return served;
}

// Removes a stale socket at `path`; refuses anything else that is there.
absl::Status ClearPath(const std::string& path, const sockaddr_un& address) {
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return Errno("cannot inspect", path);
  }
  if (!S_ISSOCK(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--listen unix:", path,
        " names an existing file that is not a socket; refusing to "
        "remove it (choose another path, or remove it yourself if it is yours to remove)"));
  }
  if (SomeoneServes(address)) {
    return absl::FailedPreconditionError(
        absl::StrCat("another process serves unix:", path,
                     " (a worker with the same --listen or local "
                     "rank?); stop it or choose another --listen"));
  }
  if (unlink(path.c_str()) != 0) return Errno("cannot remove the stale socket", path);
  return absl::OkStatus();
}

}  // namespace

TrainerSocket::TrainerSocket(Options options, int listen_fd, int stop_fd)
    : options_(std::move(options)), listen_fd_(listen_fd), stop_fd_(stop_fd) {}

absl::StatusOr<std::unique_ptr<TrainerSocket>> TrainerSocket::Open(Options options) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (options.path.empty() || options.path.size() >= sizeof(address.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("socket path '", options.path, "' must be 1 to ",
                                                   sizeof(address.sun_path) - 1, " bytes"));
  }
  std::memcpy(address.sun_path, options.path.data(), options.path.size());
  if (absl::Status s = ClearPath(options.path, address); !s.ok()) return s;
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Errno("cannot create a socket for", options.path);
  // Bound but not listening, the socket refuses every connection: its mode is set before
  // anyone can connect, whatever the umask made of it.
  const mode_t mode = options.allowed_uids.empty() ? 0600 : 0666;
  if (bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0) {
    absl::Status s = Errno("cannot bind", options.path);
    close(fd);
    return s;
  }
  if (chmod(options.path.c_str(), mode) != 0 || listen(fd, 128) != 0) {
    absl::Status s = Errno("cannot set up", options.path);
    close(fd);
    unlink(options.path.c_str());
    return s;
  }
  int stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (stop_fd < 0) {
    absl::Status s = Errno("eventfd for", options.path);
    close(fd);
    unlink(options.path.c_str());
    return s;
  }
  return std::unique_ptr<TrainerSocket>(new TrainerSocket(std::move(options), fd, stop_fd));
}

TrainerSocket::~TrainerSocket() {
  Stop();
  if (stop_fd_ >= 0) close(stop_fd_);
}

void TrainerSocket::Serve(grpc::Server* server) {
  acceptor_ = std::thread([this, server] { AcceptLoop(server); });
}

void TrainerSocket::AcceptLoop(grpc::Server* server) {
  bool backing_off = false;
  while (true) {
    // Out of descriptors, the listening socket stays readable: wait 100 ms for the stop signal
    // alone instead of spinning on it, then try again (never give up, unlike gRPC's listener).
    pollfd fds[2] = {{stop_fd_, POLLIN, 0}, {listen_fd_, POLLIN, 0}};
    if (poll(fds, backing_off ? 1 : 2, backing_off ? 100 : -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[0].revents != 0) return;
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    backing_off =
        fd < 0 && (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM);
    if (fd < 0) continue;  // the peer gave up already, or out of descriptors for a moment
    ucred cred{};
    socklen_t length = sizeof(cred);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &length) != 0) {
      close(fd);
      continue;
    }
    {
      absl::MutexLock lock(&mu_);
      if (stopped_) {
        close(fd);
        return;
      }
      // The number of a connection gRPC closed may come back here; the newest owner wins.
      connections_[fd] = TrainerCredentials{cred.pid, cred.uid, cred.gid};
    }
    grpc::AddInsecureChannelFromFd(server, fd);
  }
}

void TrainerSocket::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  uint64_t one = 1;
  (void)!write(stop_fd_, &one, sizeof(one));
  if (acceptor_.joinable()) acceptor_.join();
  close(listen_fd_);
  listen_fd_ = -1;
  unlink(options_.path.c_str());
}

absl::StatusOr<TrainerCredentials> TrainerSocket::CallerOf(
    const grpc::ServerContext& context) const {
  const std::string peer = context.peer();
  absl::string_view number = peer;
  int fd = -1;
  if (!absl::ConsumePrefix(&number, "fd:") || !absl::SimpleAtoi(number, &fd)) {
    return absl::InternalError(
        absl::StrCat("a trainer call from '", peer, "' did not come through the worker's socket"));
  }
  TrainerCredentials cred;
  {
    absl::MutexLock lock(&mu_);
    auto it = connections_.find(fd);
    if (it == connections_.end()) {
      return absl::InternalError(absl::StrCat("no credentials for trainer connection ", peer));
    }
    cred = it->second;
  }
  const uid_t own = getuid();
  if (cred.uid != own && std::find(options_.allowed_uids.begin(), options_.allowed_uids.end(),
                                   cred.uid) == options_.allowed_uids.end()) {
    return absl::PermissionDeniedError(absl::StrCat(
        "trainer pid ", cred.pid, " runs as uid ", cred.uid, ", not as this worker's uid ", own,
        "; start the worker with --trainer_uids=", cred.uid, " to allow it"));
  }
  return cred;
}

}  // namespace ckpt::worker
