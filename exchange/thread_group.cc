#include "exchange/thread_group.h"

#include <thread>

#include "absl/time/clock.h"
#include "exchange/gloo/gloo_communicator.h"

namespace ckpt {

CommunicatorMaker GlooMaker(const std::string& group_name) {
  return [group_name](Store* store, int rank, int size, absl::Time deadline) {
    GlooOptions options;
    options.group_name = group_name;
    return CreateGlooCommunicator(store, rank, size, options, deadline);
  };
}

std::vector<absl::Status> RunOnThreads(
    int size, const CommunicatorMaker& maker, absl::Duration create_timeout,
    const std::function<absl::Status(int rank, Communicator& comm)>& body) {
  InMemoryStore store;
  std::vector<absl::Status> statuses(size);
  std::vector<std::thread> threads;
  absl::Time deadline = absl::Now() + create_timeout;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      auto comm = maker(&store, r, size, deadline);
      if (!comm.ok()) {
        statuses[r] = comm.status();
        return;
      }
      statuses[r] = body(r, **comm);
    });
  }
  for (std::thread& t : threads) t.join();
  return statuses;
}

}  // namespace ckpt
