#include "common/budgeted_listener.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "spdlog/spdlog.h"

namespace ckpt {
namespace {

int64_t NowMs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

// The peer's address without its port; an IPv4-mapped IPv6 address as plain IPv4.
std::string PeerKey(const sockaddr_storage& addr) {
  char text[INET6_ADDRSTRLEN] = {0};
  if (addr.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&addr)->sin_addr, text, sizeof(text));
  } else if (addr.ss_family == AF_INET6) {
    const in6_addr& a = reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_addr;
    if (IN6_IS_ADDR_V4MAPPED(&a)) {
      inet_ntop(AF_INET, &a.s6_addr[12], text, sizeof(text));
    } else {
      inet_ntop(AF_INET6, &a, text, sizeof(text));
    }
  } else {
    return "unknown";
  }
  return text;
}

bool IsWildcard(absl::string_view host) {
  return host.empty() || host == "0.0.0.0" || host == "::" || host == "[::]";
}

// A bound, listening, non-blocking socket on the first usable address of `host` (`family` or
// any), or -1 with *error set.
int BindFirst(const char* node, int family, int port, std::string* error) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  hints.ai_family = family;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(node, std::to_string(port).c_str(), &hints, &found); rc != 0) {
    *error = gai_strerror(rc);
    return -1;
  }
  std::vector<const addrinfo*> order;  // IPv4 first, as clients dialling a name try it too
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) order.push_back(a);
  std::stable_sort(order.begin(), order.end(), [](const addrinfo* x, const addrinfo* y) {
    return x->ai_family == AF_INET && y->ai_family != AF_INET;
  });
  int fd = -1;
  for (const addrinfo* a : order) {
    fd = socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
      *error = std::strerror(errno);
      continue;
    }
    int on = 1, off = 0;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
    if (a->ai_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof(off));
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, SOMAXCONN) == 0) break;
    *error = std::strerror(errno);
    close(fd);
    fd = -1;
  }
  freeaddrinfo(found);
  return fd;
}

// The wildcard binds IPv6 "::" accepting IPv4 too, or IPv4 alone where IPv6 is off.
int BindAndListen(const std::string& host, int port, std::string* error) {
  if (IsWildcard(host)) {
    int fd = BindFirst(nullptr, AF_INET6, port, error);
    return fd >= 0 ? fd : BindFirst(nullptr, AF_INET, port, error);
  }
  const std::string bare(absl::StripSuffix(absl::StripPrefix(host, "["), "]"));
  return BindFirst(bare.c_str(), AF_UNSPEC, port, error);
}

}  // namespace

int64_t DefaultMaxConnections(int64_t open_files_limit) {
  // Keep an eighth (at least 64) for files, journals, pipes and the daemon's own channels.
  return std::max<int64_t>(16, open_files_limit - std::max<int64_t>(64, open_files_limit / 8));
}

void ApplyConnectionSettings(const ConnectionSettings& settings, grpc::ServerBuilder* builder) {
  if (settings.idle_ms > 0) {
    builder->AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS,
                                static_cast<int>(std::min<int64_t>(settings.idle_ms, INT32_MAX)));
  }
  if (settings.handshake_timeout_ms > 0) {
    builder->AddChannelArgument(
        GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
        static_cast<int>(std::min<int64_t>(settings.handshake_timeout_ms, INT32_MAX)));
  }
  if (settings.max_streams_per_connection > 0) {
    builder->AddChannelArgument(
        GRPC_ARG_MAX_CONCURRENT_STREAMS,
        static_cast<int>(std::min<int64_t>(settings.max_streams_per_connection, INT32_MAX)));
  }
}

BudgetedListener::BudgetedListener(int listen_fd, int stop_fd, int port,
                                   ConnectionBudget::Limits limits)
    : listen_fd_(listen_fd), stop_fd_(stop_fd), port_(port), limits_(limits), budget_(limits) {
  reserve_fd_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
}

absl::StatusOr<std::unique_ptr<BudgetedListener>> BudgetedListener::Open(
    const std::string& address, ConnectionBudget::Limits limits) {
  const size_t colon = address.rfind(':');
  int port = -1;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("listen address \"", address, "\" is not host:port"));
  }
  std::string error;
  int fd = BindAndListen(address.substr(0, colon), port, &error);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", address, ": ", error));
  }
  sockaddr_storage bound{};
  socklen_t length = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length);
  port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                           : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  int stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (stop_fd < 0) {
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("eventfd for ", address, ": ", std::strerror(errno)));
  }
  limits.max_total = std::max<int64_t>(1, limits.max_total);
  limits.max_per_peer = std::max<int64_t>(1, limits.max_per_peer);
  return std::unique_ptr<BudgetedListener>(new BudgetedListener(fd, stop_fd, port, limits));
}

BudgetedListener::~BudgetedListener() {
  Stop();
  close(stop_fd_);
  if (reserve_fd_ >= 0) close(reserve_fd_);
}

void BudgetedListener::Serve(
    std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor) {
  acceptor_ = std::move(acceptor);
  thread_ = std::thread([this] { AcceptLoop(); });
}

void BudgetedListener::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  uint64_t one = 1;
  (void)!write(stop_fd_, &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
  close(listen_fd_);
}

void BudgetedListener::AcceptLoop() {
  bool backing_off = false;
  while (true) {
    // While out of descriptors with no reserve, wait 100 ms without the listening socket
    // (it stays readable); otherwise wake once a second to notice closed connections.
    pollfd fds[2] = {{stop_fd_, POLLIN, 0}, {listen_fd_, POLLIN, 0}};
    const int timeout_ms = backing_off ? 100 : (budget_.total() > 0 ? 1000 : -1);
    int n = poll(fds, backing_off ? 1 : 2, timeout_ms);
    if (n < 0 && errno != EINTR) {
      spdlog::error("listener_poll_failed port={} error=\"{}\"", port_, std::strerror(errno));
      n = 0;
    }
    if (fds[0].revents != 0) return;
    Sweep(/*force=*/backing_off);
    if (reserve_fd_ < 0) reserve_fd_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
    backing_off = (n > 0 || backing_off) && !AcceptReady();
  }
}

bool BudgetedListener::AcceptReady() {
  for (int i = 0; i < 256; ++i) {
    sockaddr_storage addr{};
    socklen_t length = sizeof(addr);
    int fd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &length,
                     SOCK_CLOEXEC | SOCK_NONBLOCK);
    bool out_of_descriptors = false;
    if (fd < 0 && (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)) {
      if (reserve_fd_ < 0) {
        if (refused_++ % 1000 == 0) {
          spdlog::warn("listener_out_of_descriptors port={} connections={} (backing off)", port_,
                       budget_.total());
        }
        return false;
      }
      close(reserve_fd_);  // room for one: accept it and judge it as under a spent budget
      reserve_fd_ = -1;
      length = sizeof(addr);
      fd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &length,
                   SOCK_CLOEXEC | SOCK_NONBLOCK);
      out_of_descriptors = true;
    }
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
      continue;  // EINTR, ECONNABORTED, EPROTO, a network error: the next one
    }
    Admit(fd, PeerKey(addr), out_of_descriptors);
    if (reserve_fd_ < 0) reserve_fd_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
  }
  return true;
}

void BudgetedListener::Admit(int fd, const std::string& peer, bool out_of_descriptors) {
  inodes_.erase(fd);  // a descriptor number gRPC closed came back
  budget_.Forget(fd);
  if (out_of_descriptors || budget_.total() >= limits_.max_total ||
      budget_.PeerCount(peer) >= limits_.max_per_peer) {
    Sweep(/*force=*/false);
  }
  ConnectionBudget::Decision d = budget_.Admit(fd, peer, out_of_descriptors);
  if (d.verdict == ConnectionBudget::Verdict::kRefusePeer ||
      d.verdict == ConnectionBudget::Verdict::kRefuseTotal) {
    close(fd);
    if (refused_++ % 1000 == 0) {
      spdlog::warn(
          "connection_refused peer={} reason={} peer_connections={} connections={} "
          "max_per_peer={} max_total={} refused_so_far={}",
          peer,
          d.verdict == ConnectionBudget::Verdict::kRefusePeer ? "peer_budget" : "total_budget",
          budget_.PeerCount(peer), budget_.total(), limits_.max_per_peer, limits_.max_total,
          refused_);
    }
    return;
  }
  if (d.evict) {
    // Shut the socket down (not close: gRPC owns the descriptor and closes it on seeing the
    // end), provided the number still names the socket that was admitted.
    struct stat st {};
    auto it = inodes_.find(*d.evict);
    if (it != inodes_.end() && fstat(*d.evict, &st) == 0 && st.st_ino == it->second) {
      shutdown(*d.evict, SHUT_RDWR);
    }
    if (it != inodes_.end()) inodes_.erase(it);
    if (evicted_++ % 1000 == 0) {
      spdlog::warn("connection_evicted peer={} for_peer={} connections={} evicted_so_far={}",
                   d.evicted_peer, peer, budget_.total(), evicted_);
    }
  }
  struct stat st {};
  fstat(fd, &st);
  inodes_[fd] = st.st_ino;
  grpc::experimental::ExternalConnectionAcceptor::NewConnectionParameters params;
  params.listener_fd = listen_fd_;
  params.fd = fd;
  acceptor_->HandleNewConnection(&params);
}

void BudgetedListener::Sweep(bool force) {
  const int64_t now = NowMs();
  if (!force && now - last_sweep_ms_ < 100) return;
  last_sweep_ms_ = now;
  std::vector<int> gone;
  for (const auto& [fd, inode] : inodes_) {
    struct stat st {};
    if (fstat(fd, &st) != 0 || st.st_ino != inode || !S_ISSOCK(st.st_mode)) gone.push_back(fd);
  }
  for (int fd : gone) {
    inodes_.erase(fd);
    budget_.Forget(fd);
  }
}

}  // namespace ckpt
