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

void PieceClasses::AskOverdue(JobClasses& classes, const std::set<std::string>& digests,
                              absl::Time now) {
  for (const std::string& digest : digests) {
    if (classes.held.count(digest) > 0) continue;
    auto [it, inserted] = classes.asked.try_emplace(digest, now + supply_wait_);
    if (!inserted && it->second <= now) it->second = now + supply_wait_;
  }
}

absl::Time PieceClasses::EarliestWait(const JobClasses& classes,
                                      const std::set<std::string>& digests, absl::Time now) {
  absl::Time until = absl::InfiniteFuture();
  for (const std::string& digest : digests) {
    if (classes.held.count(digest) > 0) continue;
    auto asked = classes.asked.find(digest);
    if (asked == classes.asked.end() || asked->second <= now) return absl::InfinitePast();
    until = std::min(until, asked->second);
  }
  return until;
}

bool PieceClasses::Admit(const std::string& job, const std::set<std::string>& digests,
                         absl::Time now, absl::Time latest, Resume resume) {
  std::lock_guard<std::mutex> lock(mu_);
  JobClasses& classes = jobs_[job];
  std::set<std::string> waiting;
  for (const std::string& digest : digests) {
    if (classes.held.count(digest) == 0) waiting.insert(digest);
  }
  const absl::Time until = EarliestWait(classes, waiting, now);
  if (waiting.empty() || until == absl::InfinitePast() || latest <= now) {
    AskOverdue(classes, waiting, now);  // this call's rank is asked for each overdue class
    return true;
  }
  parked_.push_back(
      Parked{job, std::move(waiting), std::min(until, latest), latest, std::move(resume)});
  return false;
}

std::vector<PieceClasses::Resume> PieceClasses::Add(const std::string& job,
                                                    const std::string& digest,
                                                    PieceClass layout_class) {
  std::vector<Resume> ready;
  std::lock_guard<std::mutex> lock(mu_);
  JobClasses& classes = jobs_[job];
  classes.asked.erase(digest);
  const bool held = classes.held.count(digest) > 0 ||
                    static_cast<int64_t>(classes.held.size()) < max_classes_per_job_;
  // Past the bound the class is not held: its waiters go on now, their ranks sending in full.
  if (held) classes.held[digest] = std::move(layout_class);
  for (auto it = parked_.begin(); it != parked_.end();) {
    const bool waits = it->job == job && it->waiting.count(digest) > 0;
    if (waits && held) it->waiting.erase(digest);
    if (waits && (!held || it->waiting.empty())) {
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
  // In parking order: the first call to find a supplier overdue is asked in its place.
  for (auto it = parked_.begin(); it != parked_.end();) {
    if (it->until > now) {
      ++it;
      continue;
    }
    JobClasses& classes = jobs_[it->job];
    const absl::Time until = EarliestWait(classes, it->waiting, now);
    if (until == absl::InfinitePast() || it->latest <= now) {
      AskOverdue(classes, it->waiting, now);
      ready.push_back(std::move(it->resume));
      it = parked_.erase(it);
    } else {
      it->until = std::min(until, it->latest);  // another call was asked: wait for it
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
