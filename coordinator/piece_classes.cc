#include "coordinator/piece_classes.h"

#include <algorithm>
#include <utility>

namespace ckpt::coordinator {

std::optional<PieceClass> PieceClasses::Find(const std::string& job,
                                             const std::string& digest) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto j = jobs_.find(job);
  if (j == jobs_.end()) return std::nullopt;
  auto c = j->second.held.find(digest);
  if (c == j->second.held.end()) return std::nullopt;
  return c->second;
}

bool PieceClasses::Admit(const std::string& job, const std::set<std::string>& digests,
                         absl::Time now, Resume resume) {
  std::lock_guard<std::mutex> lock(mu_);
  JobClasses& classes = jobs_[job];
  std::set<std::string> waiting;
  bool asks = false;
  absl::Time until = absl::InfiniteFuture();
  for (const std::string& digest : digests) {
    if (classes.held.count(digest) > 0) continue;
    auto asked = classes.asked.find(digest);
    if (asked == classes.asked.end() || asked->second <= now) {
      asks = true;  // this call's rank is asked for it
      continue;
    }
    waiting.insert(digest);
    until = std::min(until, asked->second);
  }
  if (asks || waiting.empty()) {
    for (const std::string& digest : digests) {
      if (classes.held.count(digest) > 0) continue;
      auto [it, inserted] = classes.asked.try_emplace(digest, now + supply_wait_);
      if (!inserted && it->second <= now) it->second = now + supply_wait_;
    }
    return true;
  }
  parked_.push_back(Parked{job, std::move(waiting), until, std::move(resume)});
  return false;
}

std::vector<PieceClasses::Resume> PieceClasses::Add(const std::string& job,
                                                    const std::string& digest,
                                                    PieceClass layout_class) {
  std::vector<Resume> ready;
  std::lock_guard<std::mutex> lock(mu_);
  JobClasses& classes = jobs_[job];
  classes.asked.erase(digest);
  if (classes.held.count(digest) == 0 &&
      static_cast<int64_t>(classes.held.size()) >= max_classes_per_job_) {
    return ready;  // not held: its ranks keep sending in full; waiters expire
  }
  classes.held[digest] = std::move(layout_class);
  for (auto it = parked_.begin(); it != parked_.end();) {
    if (it->job == job) it->waiting.erase(digest);
    if (it->job == job && it->waiting.empty()) {
      ready.push_back(std::move(it->resume));
      it = parked_.erase(it);
    } else {
      ++it;
    }
  }
  return ready;
}

std::vector<PieceClasses::Resume> PieceClasses::Expire(absl::Time now) {
  std::vector<Resume> ready;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = parked_.begin(); it != parked_.end();) {
    if (it->until <= now) {
      ready.push_back(std::move(it->resume));
      it = parked_.erase(it);
    } else {
      ++it;
    }
  }
  return ready;
}

std::vector<PieceClasses::Resume> PieceClasses::DropJob(const std::string& job) {
  std::vector<Resume> ready;
  std::lock_guard<std::mutex> lock(mu_);
  jobs_.erase(job);
  for (auto it = parked_.begin(); it != parked_.end();) {
    if (it->job == job) {
      ready.push_back(std::move(it->resume));
      it = parked_.erase(it);
    } else {
      ++it;
    }
  }
  return ready;
}

std::vector<PieceClasses::Resume> PieceClasses::TakeAllParked() {
  std::vector<Resume> ready;
  std::lock_guard<std::mutex> lock(mu_);
  for (Parked& p : parked_) ready.push_back(std::move(p.resume));
  parked_.clear();
  return ready;
}

int64_t PieceClasses::classes() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t n = 0;
  for (const auto& [job, classes] : jobs_) n += static_cast<int64_t>(classes.held.size());
  return n;
}

int64_t PieceClasses::parked() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(parked_.size());
}

}  // namespace ckpt::coordinator
