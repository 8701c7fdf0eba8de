#include "common/connection_budget.h"

#include <utility>

namespace ckpt {

int64_t ConnectionBudget::PeerCount(const std::string& peer) const {
  auto it = peers_.find(peer);
  return it == peers_.end() ? 0 : static_cast<int64_t>(it->second.size());
}

void ConnectionBudget::Forget(int id) {
  auto it = connections_.find(id);
  if (it == connections_.end()) return;
  auto peer = peers_.find(it->second.peer);
  if (peer != peers_.end()) {
    peer->second.erase(it->second.seq);
    if (peer->second.empty()) peers_.erase(peer);
  }
  connections_.erase(it);
}

ConnectionBudget::Decision ConnectionBudget::Admit(int id, const std::string& peer, bool full) {
  Forget(id);
  Decision decision;
  const int64_t mine = PeerCount(peer);
  if (mine >= limits_.max_per_peer) {
    decision.verdict = Verdict::kRefusePeer;
    return decision;
  }
  if (full || total() >= limits_.max_total) {
    const std::map<uint64_t, int>* heaviest = nullptr;
    for (const auto& [name, by_age] : peers_) {
      if (heaviest == nullptr || by_age.size() > heaviest->size()) {
        heaviest = &by_age;
        decision.evicted_peer = name;
      }
    }
    if (heaviest == nullptr || static_cast<int64_t>(heaviest->size()) <= mine + 1) {
      decision.verdict = Verdict::kRefuseTotal;
      decision.evicted_peer.clear();
      return decision;
    }
    decision.verdict = Verdict::kAdmitEvicting;
    decision.evict = heaviest->begin()->second;
    Forget(*decision.evict);
  }
  const uint64_t seq = next_seq_++;
  connections_[id] = Connection{peer, seq};
  peers_[peer][seq] = id;
  return decision;
}

}  // namespace ckpt
