// gpt_trainer: one trainer rank of a GPT-style model, and the reference for embedding the ckpt
// client library in a training program. Read it top to bottom:
//
//   1. Who am I?  ckpt::client::Options left unset are resolved from the launcher's
//      environment (torchrun RANK/WORLD_SIZE/LOCAL_RANK, SLURM_PROCID/SLURM_NPROCS/
//      SLURM_LOCALID, Open MPI OMPI_COMM_WORLD_*; job from CKPT_JOB/TORCHELASTIC_RUN_ID/
//      SLURM_JOB_ID; worker from CKPT_WORKER_ADDRESS), explicit flags taking precedence.
//   2. Connect to the local worker daemon (Client::Connect).
//   3. Build the state dict: every tensor this rank holds is allocated through the library
//      (StateDict::AddHost, POSIX shared memory the worker maps, so it reads and writes the
//      trainer's bytes without copies), declared with its global shape and this rank's piece.
//   4. Checkpoint: Save (collective; the trainer may modify its tensors once it returns) and
//      SaveHandle::WaitDurable (committed), Load (collective; into whatever layout this job
//      has now), and Poll once per training step (operator requests from `ckptctl save|load`).
//
// The model state comes from examples/gpt_state.h: bf16 weights split Megatron-style over
// TP, fp32 Adam state flat-sharded ZeRO-1 style over DP, every element a deterministic function
// of (key, global index), so each rank can fill its pieces and verify every loaded element.
//
//   gpt_trainer [--job J] [--rank R] [--world-size N] [--local-rank L] [--worker unix:/path]
//               [--tp T --dp D | --layout layout.json]
//               [--model-bytes B | --layers N --hidden H --vocab V]
//               [--arrival-timeout-s S] [--step-ms MS] [--poll-ops K]
//               ACTION...        (run in the order given)
//   ACTION: --save PATH | --load PATH | --poll-steps N
//
// --save: fill, Save, overwrite every tensor right after Save returns (the checkpoint must
// hold the values from before), WaitDurable. --load: poison every tensor, Load, VerifyPiece
// every element. --poll-steps N: N training steps, each calling Poll, which performs what an
// operator requested with `ckptctl save|load`: after a save the tensors are overwritten as
// after --save, after a load every element is verified as after --load; with --poll-ops K the
// steps end once K such operations have run. (To check a checkpoint offline without a cluster:
// examples/gpt_tool.)
//
// Output: one JSON object per line on stdout: {"event":"ready",...} once the state is built,
// then one {"event":"step","op":...,"ok":...,"bytes":...,"seconds":...} per action or poll
// step. Mismatches and errors also go to stderr, naming key, rank and element. Exit status 0
// only when every action succeeded.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "examples/gpt_state.h"
#include "nlohmann/json.hpp"
#include "planner/layout_spec.h"

namespace {

using ckpt::client::Client;
using Json = nlohmann::json;

// ---------------------------------------------------------------------------------------------
// Command line.

struct Action {
  std::string op;  // "save", "load", "poll"
  std::string path;
  int64_t steps = 0;
};

struct Flags {
  ckpt::client::Options client;  // unset fields: the launcher's environment
  int64_t tp = 2, dp = 2;
  std::string layout_file;
  int64_t model_bytes = 0;                       // > 0: GptConfigForBytes
  std::optional<int64_t> layers, hidden, vocab;  // else the GptConfig defaults
  absl::Duration arrival_timeout = absl::Minutes(5);
  absl::Duration step = absl::Milliseconds(50);
  int64_t poll_ops = 0;  // > 0: polling ends after this many operator-requested operations
  std::vector<Action> actions;
};

constexpr char kUsage[] =
    "usage: gpt_trainer [--job J] [--rank R] [--world-size N] [--local-rank L]\n"
    "                   [--worker unix:/path] [--tp T --dp D | --layout layout.json]\n"
    "                   [--model-bytes B | --layers N --hidden H --vocab V]\n"
    "                   [--arrival-timeout-s S] [--step-ms MS] [--poll-ops K]\n"
    "                   (--save PATH | --load PATH | --poll-steps N)...\n"
    "One trainer rank of a GPT-style model on the ckpt client library; actions run in order.\n"
    "Rank, world size, local rank and job default to the launcher's environment (torchrun,\n"
    "SLURM, Open MPI; CKPT_JOB, CKPT_WORKER_ADDRESS). Prints one JSON line per step.\n";

absl::StatusOr<Flags> ParseFlags(int argc, char** argv) {
  Flags f;
  auto int_value = [](const std::string& flag, const std::string& text,
                      int64_t min) -> absl::StatusOr<int64_t> {
    int64_t v = 0;
    if (!absl::SimpleAtoi(text, &v) || v < min) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": expected an integer >= ", min, ", got \"", text, "\""));
    }
    return v;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") return absl::CancelledError("help");
    if (i + 1 >= argc) return absl::InvalidArgumentError(flag + ": missing value (or unknown)");
    const std::string value = argv[++i];
    absl::StatusOr<int64_t> n = int_value(flag, value, 0);
    if (flag == "--job") {
      f.client.job = value;
    } else if (flag == "--worker") {
      f.client.worker_address = value;
    } else if (flag == "--rank" || flag == "--world-size" || flag == "--local-rank") {
      if (!n.ok()) return n.status();
      int v = static_cast<int>(*n);
      (flag == "--rank"         ? f.client.rank
       : flag == "--world-size" ? f.client.world_size
                                : f.client.local_rank) = v;
    } else if (flag == "--tp" || flag == "--dp") {
      n = int_value(flag, value, 1);
      if (!n.ok()) return n.status();
      (flag == "--tp" ? f.tp : f.dp) = *n;
    } else if (flag == "--layout") {
      f.layout_file = value;
    } else if (flag == "--model-bytes" || flag == "--layers" || flag == "--hidden" ||
               flag == "--vocab") {
      n = int_value(flag, value, flag == "--layers" ? 0 : 1);
      if (!n.ok()) return n.status();
      if (flag == "--model-bytes") f.model_bytes = *n;
      if (flag == "--layers") f.layers = *n;
      if (flag == "--hidden") f.hidden = *n;
      if (flag == "--vocab") f.vocab = *n;
    } else if (flag == "--arrival-timeout-s" || flag == "--step-ms" || flag == "--poll-ops") {
      n = int_value(flag, value, 1);
      if (!n.ok()) return n.status();
      if (flag == "--arrival-timeout-s") f.arrival_timeout = absl::Seconds(*n);
      if (flag == "--step-ms") f.step = absl::Milliseconds(*n);
      if (flag == "--poll-ops") f.poll_ops = *n;
    } else if (flag == "--save" || flag == "--load") {
      f.actions.push_back({flag.substr(2), value, 0});
    } else if (flag == "--poll-steps") {
      n = int_value(flag, value, 1);
      if (!n.ok()) return n.status();
      f.actions.push_back({"poll", "", *n});
    } else {
      return absl::InvalidArgumentError("unknown flag " + flag);
    }
  }
  if (f.actions.empty()) {
    return absl::InvalidArgumentError("no action: give --save, --load or --poll-steps");
  }
  return f;
}

// ---------------------------------------------------------------------------------------------
// Output: one JSON object per line, flushed, so the launcher sees progress as it happens.

void Emit(const Json& line) {
  std::printf("%s\n", line.dump().c_str());
  std::fflush(stdout);
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

Json StatusJson(const absl::Status& s) {
  Json j = {{"ok", s.ok()}};
  if (!s.ok()) {
    j["code"] = absl::StatusCodeToString(s.code());
    j["error"] = std::string(s.message());
  }
  return j;
}

// ---------------------------------------------------------------------------------------------
// The model state of this rank: the tensors' global metadata and the pieces the layout gives
// this rank, allocated in shared memory through the client library.

struct RankState {
  std::vector<ckpt::TensorMeta> tensors;  // global metadata, in state-dict order
  std::unique_ptr<ckpt::client::StateDict> state;
  int64_t bytes = 0;         // bytes this rank holds
  int64_t stored_bytes = 0;  // of which main replica (what a save writes from this rank)
  bool holds_model = false;  // the tensors hold the model's content (filled or loaded)
};

absl::StatusOr<ckpt::LayoutSpec> LoadLayout(const Flags& f) {
  if (!f.layout_file.empty()) return ckpt::LayoutSpec::FromFile(f.layout_file);
  return ckpt::LayoutSpec::Parse(ckpt::GptLayoutJson(f.tp, f.dp));
}

absl::StatusOr<std::vector<ckpt::TensorMeta>> ModelTensors(const Flags& f) {
  ckpt::GptConfig config;
  if (f.model_bytes > 0) config = ckpt::GptConfigForBytes(f.model_bytes);
  if (f.layers) config.layers = *f.layers;
  if (f.hidden) config.hidden = *f.hidden;
  if (f.vocab) config.vocab = *f.vocab;
  return ckpt::GptTensors(config);
}

absl::StatusOr<RankState> BuildState(const Client& client, const ckpt::LayoutSpec& layout,
                                     std::vector<ckpt::TensorMeta> tensors) {
  const int rank = client.options().rank;
  if (layout.world_size() != client.options().world_size) {
    return absl::InvalidArgumentError(absl::StrCat("the layout has ", layout.world_size(),
                                                   " ranks but the job's world size is ",
                                                   client.options().world_size));
  }
  absl::StatusOr<std::vector<ckpt::TensorPiece>> pieces = layout.RankPieces(tensors, rank);
  if (!pieces.ok()) return pieces.status();
  RankState rs;
  rs.tensors = std::move(tensors);
  rs.state = client.NewStateDict();
  for (const ckpt::TensorPiece& piece : *pieces) {
    // Declare the piece: the global tensor, this rank's region (box, optionally narrowed to a
    // flat range for ZeRO-style optimizer shards) and its replica id. The library allocates
    // the bytes in a shared-memory segment the worker maps.
    ckpt::client::TensorDeclaration spec;
    spec.key = piece.key;
    spec.dtype = piece.dtype;
    spec.global_shape = piece.global_shape;
    spec.layout = piece.region;
    spec.replica_id = piece.replica_id;
    absl::StatusOr<ckpt::client::StateTensor*> t = rs.state->AddHost(spec);
    if (!t.ok()) return t.status();
    rs.bytes += (*t)->nbytes;
    if (piece.is_main_replica()) rs.stored_bytes += (*t)->nbytes;
  }
  return rs;
}

absl::Span<char> Bytes(ckpt::client::StateTensor& t) {
  return {reinterpret_cast<char*>(t.data), static_cast<size_t>(t.nbytes)};
}

// Writes the model's content (what training would have produced) into every tensor.
absl::Status FillAll(RankState& rs) {
  for (size_t i = 0; i < rs.tensors.size(); ++i) {
    ckpt::client::StateTensor& t = *rs.state->tensors()[i];
    if (absl::Status s = ckpt::FillPiece(rs.tensors[i], t.region, Bytes(t)); !s.ok()) return s;
  }
  rs.holds_model = true;
  return absl::OkStatus();
}

// Overwrites every tensor with `byte`: "the next optimizer step", or poison before a load.
void Overwrite(RankState& rs, unsigned char byte) {
  for (const auto& t : rs.state->tensors()) std::memset(t->data, byte, t->nbytes);
  rs.holds_model = false;
}

// Checks every element of every tensor; returns (elements checked, mismatching tensors) and
// prints each mismatch (VerifyPiece names key, region, global index, expected and actual).
std::pair<int64_t, std::vector<std::string>> VerifyAll(RankState& rs, int rank) {
  int64_t elements = 0;
  std::vector<std::string> mismatches;
  for (size_t i = 0; i < rs.tensors.size(); ++i) {
    ckpt::client::StateTensor& t = *rs.state->tensors()[i];
    elements += t.region.NumElements();
    absl::Status s = ckpt::VerifyPiece(rs.tensors[i], t.region, Bytes(t));
    if (!s.ok()) {
      std::string m = absl::StrCat("rank ", rank, ": ", s.message());
      std::fprintf(stderr, "gpt_trainer: mismatch: %s\n", m.c_str());
      mismatches.push_back(std::move(m));
    }
  }
  return {elements, mismatches};
}

Json LoadedJson(RankState& rs, int rank) {
  auto start = std::chrono::steady_clock::now();
  auto [elements, mismatches] = VerifyAll(rs, rank);
  Json j = {{"verified_elements", elements},
            {"mismatched_tensors", mismatches.size()},
            {"verify_seconds", SecondsSince(start)}};
  if (!mismatches.empty()) {
    j["ok"] = false;
    j["error"] = mismatches.front();
  }
  rs.holds_model = mismatches.empty();
  return j;
}

// ---------------------------------------------------------------------------------------------
// The actions.

Json Save(Client& client, RankState& rs, const std::string& path, const Flags& f) {
  Json j = {{"op", "save"}, {"path", path}, {"bytes", rs.bytes}, {"stored_bytes", rs.stored_bytes}};
  // Refill when an earlier save overwrote the tensors (the snapshot proof below).
  if (!rs.holds_model) {
    if (absl::Status s = FillAll(rs); !s.ok()) return j.update(StatusJson(s)), j;
  }
  ckpt::client::SaveOptions options;
  options.metadata = {{"producer", "gpt_trainer"}};
  options.arrival_timeout = f.arrival_timeout;
  auto start = std::chrono::steady_clock::now();
  // Collective over the job's ranks. Returns once the state is snapshotted: from here on the
  // trainer may change its tensors while the workers finish writing.
  absl::StatusOr<std::unique_ptr<ckpt::client::SaveHandle>> handle =
      client.Save(path, *rs.state, options);
  j["snapshot_seconds"] = SecondsSince(start);
  if (!handle.ok()) return j.update(StatusJson(handle.status())), j;
  j["operation_id"] = (*handle)->operation_id();
  // Training goes on: overwrite everything. The checkpoint must still hold the values from
  // before (the loads and `gpt_tool check` prove it element by element).
  Overwrite(rs, 0x5A);
  // Never report "saved" before the data is durable: wait for the commit.
  absl::Status durable = (*handle)->WaitDurable(absl::Hours(1));
  j["seconds"] = SecondsSince(start);
  return j.update(StatusJson(durable)), j;
}

Json Load(Client& client, RankState& rs, const std::string& path, const Flags& f) {
  Json j = {{"op", "load"}, {"path", path}, {"bytes", rs.bytes}};
  Overwrite(rs, 0xA5);  // poison: an element the load does not write cannot pass VerifyPiece
  // The verification must be able to fail: count the poisoned tensors it already rejects (it
  // stops at the first wrong element, so this is cheap).
  int64_t rejected = 0;
  for (size_t i = 0; i < rs.tensors.size(); ++i) {
    ckpt::client::StateTensor& t = *rs.state->tensors()[i];
    if (!ckpt::VerifyPiece(rs.tensors[i], t.region, Bytes(t)).ok()) ++rejected;
  }
  j["poison_rejected_tensors"] = rejected;
  ckpt::client::LoadOptions options;
  options.arrival_timeout = f.arrival_timeout;
  // Each stored piece is read once, by one worker, and exchanged between the workers; "" lets
  // the coordinator's --load_algorithm choose how (broadcast unless told otherwise).
  options.exchange_algorithm = "";
  auto start = std::chrono::steady_clock::now();
  // Collective: every rank fills its own pieces, whatever layout the checkpoint was saved in.
  absl::Status s = client.Load(path, *rs.state, options);
  j["seconds"] = SecondsSince(start);
  j.update(StatusJson(s));
  if (s.ok()) j.update(LoadedJson(rs, client.options().rank));
  return j;
}

// N training steps; each step calls Poll, which runs an operator-requested save or load.
bool PollSteps(Client& client, RankState& rs, int64_t steps, const Flags& f) {
  bool ok = true;
  int64_t performed = 0;
  for (int64_t step = 0; step < steps; ++step) {
    std::this_thread::sleep_for(absl::ToChronoMilliseconds(f.step));  // "forward + backward"
    auto start = std::chrono::steady_clock::now();
    absl::StatusOr<ckpt::client::PollResult> polled = client.Poll(*rs.state);
    Json j = {{"op", "poll"}, {"step", step}, {"seconds", SecondsSince(start)}};
    if (!polled.ok()) {
      j.update(StatusJson(polled.status()));
    } else {
      j["ok"] = true;
      j["performed"] = polled->performed;
      if (polled->performed) {
        ++performed;
        j.update({{"kind", polled->kind}, {"path", polled->path}, {"bytes", rs.bytes}});
        if (polled->kind == "load") j.update(LoadedJson(rs, client.options().rank));
        // Poll returns after the save is durable; training then moves on (the checkpoint must
        // keep the values from before, and a later load must bring them back).
        if (polled->kind == "save") {
          j["stored_bytes"] = rs.stored_bytes;
          Overwrite(rs, 0x5A);
        }
      }
    }
    j["event"] = "step";
    j["rank"] = client.options().rank;
    Emit(j);
    ok = ok && j["ok"].get<bool>();
    if (!polled.ok() || (f.poll_ops > 0 && performed >= f.poll_ops)) break;
  }
  if (ok && performed < f.poll_ops) {
    std::fprintf(stderr,
                 "gpt_trainer: rank %d: %lld operator-requested operation(s) ran in %lld "
                 "steps, expected %lld (--poll-ops)\n",
                 client.options().rank, static_cast<long long>(performed),
                 static_cast<long long>(steps), static_cast<long long>(f.poll_ops));
    return false;
  }
  return ok;
}

int Fail(const std::string& what, const absl::Status& s) {
  std::fprintf(stderr, "gpt_trainer: %s: %s\n", what.c_str(), s.ToString().c_str());
  return 1;
}

int Run(int argc, char** argv) {
  absl::StatusOr<Flags> flags = ParseFlags(argc, argv);
  if (!flags.ok()) {
    if (absl::IsCancelled(flags.status())) return std::fputs(kUsage, stdout), 0;
    std::fprintf(stderr, "gpt_trainer: %s\n%s", std::string(flags.status().message()).c_str(),
                 kUsage);
    return 2;
  }
  const Flags& f = *flags;
  absl::StatusOr<ckpt::LayoutSpec> layout = LoadLayout(f);
  if (!layout.ok()) return Fail("layout", layout.status());
  absl::StatusOr<std::vector<ckpt::TensorMeta>> tensors = ModelTensors(f);
  if (!tensors.ok()) return Fail("model", tensors.status());

  // 1-2. Identity (explicit flags, else the launcher's env) and the local worker.
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(f.client);
  if (!client.ok()) return Fail("connect", client.status());
  const ckpt::client::ResolvedOptions& me = (*client)->options();

  // 3. The state dict in shared memory, shared with the worker up front so that a bad
  // declaration fails here rather than in the middle of the first checkpoint.
  auto start = std::chrono::steady_clock::now();
  absl::StatusOr<RankState> rs = BuildState(**client, *layout, *std::move(tensors));
  if (!rs.ok()) return Fail(absl::StrCat("rank ", me.rank, ": state"), rs.status());
  if (absl::Status s = (*client)->Share(*rs->state); !s.ok()) {
    return Fail(absl::StrCat("rank ", me.rank, ": share"), s);
  }
  Emit({{"event", "ready"},
        {"job", me.job},
        {"rank", me.rank},
        {"world_size", me.world_size},
        {"local_rank", me.local_rank},
        {"launcher", me.launcher},
        {"worker", (*client)->worker_id()},
        {"tensors", rs->tensors.size()},
        {"bytes", rs->bytes},
        {"stored_bytes", rs->stored_bytes},
        {"seconds", SecondsSince(start)}});
  // Training would start here with the model's content (a job that starts by loading a
  // checkpoint gets it from there instead).
  if (f.actions.front().op != "load") {
    start = std::chrono::steady_clock::now();
    if (absl::Status s = FillAll(*rs); !s.ok()) return Fail("fill", s);
    Emit({{"event", "filled"}, {"rank", me.rank}, {"seconds", SecondsSince(start)}});
  }

  // 4. The scripted checkpoint actions, in command-line order.
  bool ok = true;
  for (const Action& a : f.actions) {
    if (a.op == "poll") {
      ok = PollSteps(**client, *rs, a.steps, f) && ok;
      continue;
    }
    Json j = a.op == "save" ? Save(**client, *rs, a.path, f) : Load(**client, *rs, a.path, f);
    j["event"] = "step";
    j["rank"] = me.rank;
    Emit(j);
    if (!j["ok"].get<bool>()) {
      std::fprintf(stderr, "gpt_trainer: rank %d: %s %s failed: %s\n", me.rank, a.op.c_str(),
                   a.path.c_str(), j.value("error", std::string("?")).c_str());
      ok = false;
      break;  // later actions depend on this one
    }
  }
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) { return Run(argc, argv); }
