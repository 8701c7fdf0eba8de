// A minimal trainer rank for the services tests: connects to its worker through the client
// library, allocates one host tensor in shared memory filled with a known pattern, shares it,
// and then (by --mode) holds until killed, saves, loads or polls. Every event is printed as a
// line on stdout (flushed), for the test to read:
//   connected <worker_id> <session_id>
//   segment <name> <nbytes>
//   shared
//   snapshotted                    (save: Save returned; the trainer may change its tensors)
//   mutated                        (save_mutate: the tensor was overwritten right after Save)
//   result <absl code number> <message>   (save: after WaitDurable)
//   first_saved <code> <message>   (save with --then_save P2: the first save, before P2's)
//   polled <performed 0|1>
//   poll_unavailable <message>     (poll: the coordinator was unreachable; polling goes on)
//
//   verified <elements>            (load: every element holds its global flat index)
//   mismatch <local index> <got> <want>
//   sentinel                       (--check_file, after a failed load: the tensor now holds
//                                   a sentinel; it waits for the check file to exist, then)
//   untouched | overwritten <local index> <value>
//
//   trainer_probe --worker unix:/path --job J --rank R --world_size N
//                 --mode hold|save|save_mutate|load|poll [--path P] [--elements N]
//                 [--layout rows|dtensor|cols|flat|tpdp] [--global_rows G] [--tp T]
//                 [--algorithm A] [--budget BYTES] [--rpc_timeout_ms MS] [--check_file F]
//                 [--replicas N] [--persist_to P] [--persist_overwrite 1] [--groups SPEC]
//                 [--start_file F] [--then_save P2] [--overwrite 1]
// The tensor "probe.weight" has shape (G, elements) (G defaults to the world size); "rows": rank
// r holds row r; "dtensor": Shard(0) over a 1-d mesh of all ranks (torch.chunk rows);
// "cols": Shard(1) over all ranks (column blocks); "flat": an even split of the flattened
// tensor; "tpdp": a (world/T, T) mesh, Shard(0) over the
// T tensor-parallel ranks and replicated over the data-parallel ones (rank = dp * T + tp).
// --algorithm and --budget are the load's exchange algorithm and memory budget; --replicas the
// copies of a memory save (mem://) on other hosts; --persist_to its background persistence;
// --groups the save's and load's process groups (planner/process_groups.h spec text);
// --compression the save's compression spec (SaveOptions::compression); --overwrite 1 lets the
// save replace a committed checkpoint at its path (SaveOptions::overwrite).
// --check_file: after a failed load, fill the tensor with a sentinel, say so, and once the test
// created F report whether anything (a worker still running the aborted load) wrote into it.
// --start_file: after "shared", wait until the test created F before the save or load (so a
// test can act between a rank's sharing and its operation).
// Element values are their global flat index.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/time/clock.h"
#include "client/client.h"

namespace {

// How long one simulated training step of the "poll" mode takes.
constexpr absl::Duration kTrainingStep = absl::Milliseconds(50);

// Waits until `path` exists (polled every 10 ms); false at `deadline`.
bool WaitForFile(const std::string& path, absl::Time deadline) {
  struct stat st;
  while (stat(path.c_str(), &st) != 0) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return true;
}

void Emit(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

int Run(int argc, char** argv) {
  std::string worker, job, mode = "hold", path = "/tmp/ckpt-probe";
  int rank = -1, world_size = -1;
  int64_t elements = 1024;
  int64_t global_rows = -1;
  std::string layout = "rows";
  int64_t tp = -1;
  int64_t rpc_timeout_ms = 10000;
  std::string check_file, start_file, then_save;
  ckpt::client::LoadOptions load_options;
  ckpt::client::SaveOptions save_options;
  // The multi-process tests exercise the exchange unless they name an algorithm (the client's
  // own default leaves the choice to the coordinator, whose auto reads directly on one host).
  load_options.exchange_algorithm = "broadcast";
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--worker") {
      worker = value;
    } else if (flag == "--job") {
      job = value;
    } else if (flag == "--rank") {
      absl::SimpleAtoi(value, &rank);
    } else if (flag == "--world_size") {
      absl::SimpleAtoi(value, &world_size);
    } else if (flag == "--mode") {
      mode = value;
    } else if (flag == "--path") {
      path = value;
    } else if (flag == "--elements") {
      absl::SimpleAtoi(value, &elements);
    } else if (flag == "--layout") {
      layout = value;
    } else if (flag == "--global_rows") {
      absl::SimpleAtoi(value, &global_rows);
    } else if (flag == "--tp") {
      absl::SimpleAtoi(value, &tp);
    } else if (flag == "--algorithm") {
      load_options.exchange_algorithm = value;
    } else if (flag == "--compression") {
      save_options.compression = value;
    } else if (flag == "--groups") {
      save_options.process_groups = value;
      load_options.process_groups = value;
    } else if (flag == "--replicas") {
      absl::SimpleAtoi(value, &save_options.memory_replicas);
    } else if (flag == "--persist_to") {
      save_options.persist_to = value;
    } else if (flag == "--overwrite") {
      save_options.overwrite = value == "1" || value == "true";
    } else if (flag == "--persist_overwrite") {
      save_options.persist_overwrite = value == "1" || value == "true";
    } else if (flag == "--budget") {
      absl::SimpleAtoi(value, &load_options.memory_budget_bytes);
    } else if (flag == "--rpc_timeout_ms") {
      absl::SimpleAtoi(value, &rpc_timeout_ms);
    } else if (flag == "--check_file") {
      check_file = value;
    } else if (flag == "--start_file") {
      start_file = value;
    } else if (flag == "--then_save") {
      then_save = value;
    } else {
      std::fprintf(stderr, "trainer_probe: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  ckpt::client::Options options;
  options.worker_address = worker;
  if (!job.empty()) options.job = job;
  if (rank >= 0) options.rank = rank;
  if (world_size >= 0) options.world_size = world_size;
  options.rpc_timeout = absl::Milliseconds(rpc_timeout_ms);
  auto client = ckpt::client::Client::Connect(options);
  if (!client.ok()) {
    Emit("result " + std::to_string(static_cast<int>(client.status().code())) + " " +
         std::string(client.status().message()));
    return 1;
  }
  Emit("connected " + (*client)->worker_id() + " " + (*client)->session_id());
  auto state = (*client)->NewStateDict();
  ckpt::client::TensorDeclaration spec;
  spec.key = "probe.weight";
  spec.dtype = ckpt::DType::kI32;
  const int64_t world = (*client)->options().world_size;
  const int64_t me = (*client)->options().rank;
  if (global_rows < 0) global_rows = world;
  spec.global_shape = {global_rows, elements};
  if (layout == "rows") {
    spec.layout = ckpt::Region{{me, 0}, {1, elements}, std::nullopt};
  } else if (layout == "dtensor") {
    spec.layout = ckpt::client::DTensorLayout{{world}, {ckpt::Placement::Shard(0)}};
  } else if (layout == "tpdp") {
    if (tp <= 0) tp = world;
    if (world % tp != 0) {
      std::fprintf(stderr, "trainer_probe: --tp %ld does not divide the world size\n",
                   static_cast<long>(tp));
      return 2;
    }
    spec.layout = ckpt::client::DTensorLayout{
        {world / tp, tp}, {ckpt::Placement::Replicate(), ckpt::Placement::Shard(0)}};
  } else if (layout == "cols") {
    spec.layout = ckpt::client::DTensorLayout{{world}, {ckpt::Placement::Shard(1)}};
  } else if (layout == "flat") {
    int64_t total = global_rows * elements, chunk = (total + world - 1) / world;
    spec.layout = ckpt::FlatRange{std::min(total, me * chunk), std::min(total, (me + 1) * chunk)};
  } else {
    std::fprintf(stderr, "trainer_probe: unknown layout %s\n", layout.c_str());
    return 2;
  }
  auto tensor = state->AddHost(spec);
  if (!tensor.ok()) {
    Emit("result " + std::to_string(static_cast<int>(tensor.status().code())) + " " +
         std::string(tensor.status().message()));
    return 1;
  }
  // Content: the global flat index of each element (flat ranges are of the whole tensor).
  const ckpt::Region& region = (*tensor)->region;
  const int64_t count = (*tensor)->nbytes / 4;
  auto expected = [&](int64_t i) {
    if (region.flat) return static_cast<int32_t>(region.flat->start + i);
    const int64_t width = region.lengths[1];
    return static_cast<int32_t>((region.offsets[0] + i / width) * elements + region.offsets[1] +
                                i % width);
  };
  if (mode != "load") {
    for (int64_t i = 0; i < count; ++i) {
      int32_t v = expected(i);
      std::memcpy((*tensor)->data + i * 4, &v, 4);
    }
  }
  Emit("segment " + (*tensor)->segment + " " + std::to_string((*tensor)->nbytes));
  if (absl::Status s = (*client)->Share(*state); !s.ok()) {
    Emit("result " + std::to_string(static_cast<int>(s.code())) + " " + std::string(s.message()));
    return 1;
  }
  Emit("shared");
  if (!start_file.empty() && !WaitForFile(start_file, absl::Now() + absl::Minutes(5))) {
    Emit("start_file_never_appeared " + start_file);
    return 1;
  }
  absl::Status result;
  if (mode == "hold") {
    while (true) pause();
  } else if (mode == "save" || mode == "save_mutate") {
    auto handle = (*client)->Save(path, *state, save_options);
    result = handle.status();
    if (handle.ok()) {
      Emit("snapshotted");
      if (mode == "save_mutate") {
        // Training goes on at once: the checkpoint must still hold the values at Save.
        std::memset((*tensor)->data, 0xff, static_cast<size_t>((*tensor)->nbytes));
        Emit("mutated");
      }
      result = (*handle)->WaitDurable(absl::Minutes(5));
    }
    if (!then_save.empty()) {
      // A repeat save of the same, unchanged state (the same session): a second checkpoint.
      Emit("first_saved " + std::to_string(static_cast<int>(result.code())) + " " +
           std::string(result.message()));
      auto again = (*client)->Save(then_save, *state, save_options);
      result = again.ok() ? (*again)->WaitDurable(absl::Minutes(5)) : again.status();
    }
  } else if (mode == "save_and_wait") {
    // A blocking save: lends every host tensor and returns once committed.
    auto info = (*client)->SaveAndWait(path, *state, save_options, absl::Minutes(5));
    result = info.status();
    if (info.ok()) {
      Emit("snapshot copied_bytes=" + std::to_string(info->copied_bytes) +
           " lent_bytes=" + std::to_string(info->lent_bytes));
    }
  } else if (mode == "load") {
    result = (*client)->Load(path, *state, load_options);
  } else if (mode == "poll") {
    // A training loop: each step computes (here: 50 ms of pacing, which stands for the step's
    // work and orders nothing) and then polls. The test waits on this process's output lines.
    const absl::Time give_up = absl::Now() + absl::Minutes(5);
    while (true) {
      if (absl::Now() >= give_up) {
        result = absl::DeadlineExceededError("no operation was performed within 5 minutes");
        break;
      }
      auto polled = (*client)->Poll(*state);
      if (!polled.ok() && polled.status().code() == absl::StatusCode::kUnavailable) {
        // The coordinator is away (restarting): a training loop trains on and polls again.
        Emit("poll_unavailable " + std::string(polled.status().message()));
        absl::SleepFor(kTrainingStep);
        continue;
      }
      if (!polled.ok()) {
        result = polled.status();
        break;
      }
      if (polled->performed) break;
      absl::SleepFor(kTrainingStep);
    }
  } else {
    std::fprintf(stderr, "trainer_probe: unknown mode %s\n", mode.c_str());
    return 2;
  }
  Emit("result " + std::to_string(static_cast<int>(result.code())) + " " +
       std::string(result.message()));
  if (mode == "load" && result.ok()) {
    for (int64_t i = 0; i < count; ++i) {
      int32_t v = 0;
      std::memcpy(&v, (*tensor)->data + i * 4, 4);
      if (v != expected(i)) {
        Emit("mismatch " + std::to_string(i) + " " + std::to_string(v) + " " +
             std::to_string(expected(i)));
        return 1;
      }
    }
    Emit("verified " + std::to_string(count));
  }
  if (mode == "load" && !result.ok() && !check_file.empty()) {
    // The load failed: from now on no worker may write this memory.
    constexpr int32_t kSentinel = 0x5a5a5a5a;
    for (int64_t i = 0; i < count; ++i) std::memcpy((*tensor)->data + i * 4, &kSentinel, 4);
    Emit("sentinel");
    // The test creates `check_file` (a ready file) when the scenario is over; the sentinel must
    // still be there then.
    if (!WaitForFile(check_file, absl::Now() + absl::Minutes(5))) {
      Emit("check_file_never_appeared " + check_file);
      return 1;
    }
    for (int64_t i = 0; i < count; ++i) {
      int32_t v = 0;
      std::memcpy(&v, (*tensor)->data + i * 4, 4);
      if (v != kSentinel) {
        Emit("overwritten " + std::to_string(i) + " " + std::to_string(v));
        return 1;
      }
    }
    Emit("untouched");
  }
  return result.ok() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) { return Run(argc, argv); }
