// A trainer or inference rank for the live-transfer tests (tests/transfer_test.cc): connects to
// its worker through the client library, declares one int32 tensor "probe.weight" of shape
// (--global_rows, --elements) in a (world/--tp, --tp) mesh (Shard(0) over the tp ranks,
// replicated over the others), and publishes or receives it. Version v of element i (its
// global flat index) is i + v * 10,000,000. Every event is a line on stdout (flushed):
//   publish mode: for v in 1..--versions: fills version v, publishes it, says
//     "published <v>", overwrites its tensor at once (training goes on: the published version
//     must not change), waits until the version is published ("durable <v> <code> <message>"),
//     then, before the next version, waits for the file <--step_dir>/publish.<v+1>.
//   receive mode: for k in 1..--receives: waits for <--step_dir>/receive.<k>, receives the
//     newest version (or --version), says "received <k> <code> <message>", when it succeeded
//     "version <name> <v>" (the version Receive reported), and then what its tensor holds: "holds
//     <v>" (every element is version v; 0: never received) or "mixed <local index> <value>"
//     (elements of different versions, or garbage).
//   poll mode: fills version --fill_version (0: leaves zeros), then polls once per 20 ms until
//     an operator-requested operation ran (ckptctl save|load --job J xfer://<name>), says
//     "polled <kind> <code> <message>" and what its tensor holds.
//   transfer_probe --worker unix:/path --job J --rank R --world_size N --mode publish|receive
//                  --name NAME [--tp T] [--global_rows G] [--elements E] [--versions V]
//                  [--receives K] [--version V] [--verify 1] [--budget BYTES] [--step_dir D]
//                  [--algorithm A]
#include <sys/stat.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"

namespace {

constexpr int64_t kVersionStride = 10000000;

void Emit(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

// Waits until `path` exists (polled every 10 ms); false after 5 minutes.
bool WaitForFile(const std::string& path) {
  const absl::Time deadline = absl::Now() + absl::Minutes(5);
  struct stat st;
  while (stat(path.c_str(), &st) != 0) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return true;
}

int64_t Flag(const std::map<std::string, std::string>& flags, const std::string& name,
             int64_t fallback) {
  auto it = flags.find(name);
  int64_t value = fallback;
  if (it != flags.end() && !absl::SimpleAtoi(it->second, &value)) return fallback;
  return value;
}

// The global flat index of local element i of `t`.
int64_t FlatIndex(const ckpt::client::StateTensor& t, int64_t i) {
  const int64_t width = t.region.lengths[1];
  return (t.region.offsets[0] + i / width) * t.global_shape[1] + t.region.offsets[1] + i % width;
}

void Fill(ckpt::client::StateTensor& t, int64_t version) {
  for (int64_t i = 0; i < t.nbytes / 4; ++i) {
    const int32_t v = static_cast<int32_t>(FlatIndex(t, i) + version * kVersionStride);
    std::memcpy(t.data + i * 4, &v, 4);
  }
}

// "holds <v>" or "mixed <i> <value>".
std::string Holds(const ckpt::client::StateTensor& t) {
  int64_t version = -1;
  for (int64_t i = 0; i < t.nbytes / 4; ++i) {
    int32_t v = 0;
    std::memcpy(&v, t.data + i * 4, 4);
    const int64_t rest = v - FlatIndex(t, i);
    const int64_t this_version = rest % kVersionStride == 0 ? rest / kVersionStride : -2;
    if (v == 0 && FlatIndex(t, i) != 0) {
      if (version < 0) version = 0;
      if (version == 0) continue;
    }
    if (version == -1) version = this_version;
    if (this_version != version || version < 0) {
      return absl::StrCat("mixed ", i, " ", v);
    }
  }
  return absl::StrCat("holds ", version < 0 ? 0 : version);
}

std::string Said(const absl::Status& s) {
  return absl::StrCat(static_cast<int>(s.code()), " ", s.message());
}

int Run(int argc, char** argv) {
  std::map<std::string, std::string> flags;
  for (int i = 1; i + 1 < argc; i += 2) flags[argv[i]] = argv[i + 1];
  ckpt::client::Options options;
  options.worker_address = flags["--worker"];
  options.job = flags["--job"];
  options.rank = static_cast<int>(Flag(flags, "--rank", 0));
  options.world_size = static_cast<int>(Flag(flags, "--world_size", 1));
  options.rpc_timeout = absl::Seconds(10);
  auto client = ckpt::client::Client::Connect(options);
  if (!client.ok()) {
    Emit("result " + Said(client.status()));
    return 1;
  }
  const int64_t world = Flag(flags, "--world_size", 1), tp = Flag(flags, "--tp", world);
  auto state = (*client)->NewStateDict();
  ckpt::client::TensorDeclaration spec;
  spec.key = "probe.weight";
  spec.dtype = ckpt::DType::kI32;
  spec.global_shape = {Flag(flags, "--global_rows", tp), Flag(flags, "--elements", 1024)};
  spec.layout = ckpt::client::DTensorLayout{
      {world / tp, tp}, {ckpt::Placement::Replicate(), ckpt::Placement::Shard(0)}};
  auto tensor = state->AddHost(spec);
  if (!tensor.ok()) {
    Emit("result " + Said(tensor.status()));
    return 1;
  }
  const std::string name = flags["--name"], dir = flags["--step_dir"];
  if (flags["--mode"] == "poll") {
    if (Flag(flags, "--fill_version", 0) > 0) Fill(**tensor, Flag(flags, "--fill_version", 0));
    const absl::Time give_up = absl::Now() + absl::Minutes(5);
    absl::StatusOr<ckpt::client::PollResult> polled = ckpt::client::PollResult{};
    while (absl::Now() < give_up) {
      polled = (*client)->Poll(*state);
      if (!polled.ok() || polled->performed) break;
      absl::SleepFor(absl::Milliseconds(20));  // stands for a training step; orders nothing
    }
    Emit(absl::StrCat("polled ", polled.ok() ? polled->kind : "-", " ", Said(polled.status())));
    Emit(Holds(**tensor));
    return 0;
  }
  if (flags["--mode"] == "publish") {
    for (int64_t v = 1; v <= Flag(flags, "--versions", 1); ++v) {
      if (v > 1 && !WaitForFile(absl::StrCat(dir, "/publish.", v))) return 1;
      Fill(**tensor, v);
      ckpt::client::PublishOptions publish;
      publish.version = v;
      auto handle = (*client)->Publish(name, *state, publish);
      if (!handle.ok()) {
        Emit(absl::StrCat("durable ", v, " ", Said(handle.status())));
        return 1;
      }
      Emit(absl::StrCat("published ", (*handle)->version()));
      std::memset((*tensor)->data, 0x7f, static_cast<size_t>((*tensor)->nbytes));
      Emit(absl::StrCat("durable ", v, " ", Said((*handle)->WaitPublished(absl::Minutes(5)))));
    }
    return 0;
  }
  for (int64_t k = 1; k <= Flag(flags, "--receives", 1); ++k) {
    if (!WaitForFile(absl::StrCat(dir, "/receive.", k))) return 1;
    ckpt::client::ReceiveOptions receive;
    receive.version = Flag(flags, "--version", 0);
    receive.verify = Flag(flags, "--verify", 0) != 0;
    receive.memory_budget_bytes = Flag(flags, "--budget", 0);
    receive.exchange_algorithm = flags["--algorithm"];
    receive.arrival_timeout = absl::Minutes(2);
    absl::StatusOr<ckpt::client::ReceivedVersion> got = (*client)->Receive(name, *state, receive);
    Emit(absl::StrCat("received ", k, " ", Said(got.status())));
    if (got.ok()) Emit(absl::StrCat("version ", got->name, " ", got->version));
    Emit(Holds(**tensor));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return Run(argc, argv); }
