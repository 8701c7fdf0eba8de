// The connection budget of a daemon's listening socket: at most `max_total` connections in all
// and `max_per_peer` from one peer address. A pure bookkeeping core (no sockets, no threads):
// common/budgeted_listener.h asks it what to do with each accepted connection and tells it which
// ones have gone.
//
// When the total is spent, a newcomer from a peer holding fewer connections than the heaviest
// peer less one takes the place of that peer's oldest connection (which the caller then shuts
// down), so one flooding peer, or a few, cannot lock every other peer out. A newcomer from a peer
// that already holds a fair share is refused.
#ifndef CKPT_COMMON_CONNECTION_BUDGET_H_
#define CKPT_COMMON_CONNECTION_BUDGET_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>

namespace ckpt {

class ConnectionBudget {
 public:
  struct Limits {
    int64_t max_total = 1;
    int64_t max_per_peer = 1;
  };
  enum class Verdict {
    kAdmit,          // within budget
    kAdmitEvicting,  // admitted in place of `evict` (the heaviest peer's oldest connection)
    kRefusePeer,     // the peer holds max_per_peer connections already
    kRefuseTotal,    // the total is spent and the peer holds a fair share of it
  };
  struct Decision {
    Verdict verdict = Verdict::kAdmit;
    std::optional<int> evict;  // the connection to shut down (kAdmitEvicting)
    std::string evicted_peer;  // its peer
  };

  explicit ConnectionBudget(Limits limits) : limits_(limits) {}

  // Decides on a new connection `id` (a file descriptor number) from `peer`; `full` says that
  // the total is spent whatever the count says (the process ran out of descriptors). An admitted
  // connection is counted until Forget(id); an evicted one is forgotten already. A connection
  // still counted under the same id is forgotten first (the id was reused).
  Decision Admit(int id, const std::string& peer, bool full);
  // The connection `id` has gone (no-op for an unknown id).
  void Forget(int id);

  int64_t total() const { return static_cast<int64_t>(connections_.size()); }
  int64_t PeerCount(const std::string& peer) const;
  const Limits& limits() const { return limits_; }

 private:
  struct Connection {
    std::string peer;
    uint64_t seq = 0;
  };
  Limits limits_;
  uint64_t next_seq_ = 0;
  std::map<int, Connection> connections_;
  // Per peer: its connections by age (seq -> id).
  std::unordered_map<std::string, std::map<uint64_t, int>> peers_;
};

}  // namespace ckpt

#endif  // CKPT_COMMON_CONNECTION_BUDGET_H_
