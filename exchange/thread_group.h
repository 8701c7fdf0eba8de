// Test and benchmark helper: runs one function per rank on N threads of this process, each
// with its own communicator joined through a shared InMemoryStore.
#ifndef CKPT_EXCHANGE_THREAD_GROUP_H_
#define CKPT_EXCHANGE_THREAD_GROUP_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "exchange/communicator.h"
#include "rendezvous/store.h"

namespace ckpt {

// Creates the communicator of `rank` in a group of `size` over `store`.
using CommunicatorMaker = std::function<absl::StatusOr<std::unique_ptr<Communicator>>(
    Store* store, int rank, int size, absl::Time deadline)>;

// A maker for Gloo on 127.0.0.1 with the given group name.
CommunicatorMaker GlooMaker(const std::string& group_name);

// Runs body(rank, comm) on `size` threads; returns each rank's status (creation failures
// included). All threads are joined before returning.
std::vector<absl::Status> RunOnThreads(
    int size, const CommunicatorMaker& maker, absl::Duration create_timeout,
    const std::function<absl::Status(int rank, Communicator& comm)>& body);

}  // namespace ckpt

#endif  // CKPT_EXCHANGE_THREAD_GROUP_H_
