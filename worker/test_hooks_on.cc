// The test seams of the testonly worker daemon //worker:ckpt_worker_testing, which the
// multi-process tests run. Link-time injection: each function here replaces the weak, do-nothing
// release definition of the same function (worker/transfer_verify.cc, transfer_serve.cc,
// persist_executor.cc, object_upload.cc); the release daemon //worker:ckpt_worker links none of
// this (its seams do nothing and test nothing, and it refuses --persist_gate_file as an unknown
// flag).
// - --persist_gate_file=FILE: before writing a background-persistence item, create
//   FILE.waiting and wait until FILE exists (orders a test's events against a persistence in
//   progress; tests/memory_persist_e2e_test.cc);
// - --upload_gate_file=FILE: before a rank uploads its files to an object store, create
//   FILE.waiting and wait until FILE exists (tests/s3_cluster_test.cc kills the server then);
// - CKPT_TEST_SERVE_HOLD_DIR=DIR with DIR/hold present: a serving part that finished a wave
//   writes DIR/held.<pid> and then waits, sending nothing more, until its operation is aborted
//   or the worker stops (a source worker stalled mid-transfer, for a test to kill);
// - CKPT_TEST_CORRUPT_SENT_UNITS=1: flips one byte of every unit read for a verified receive,
//   after its checksum was taken (the corruption a faulty link would cause in flight).
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "worker/object_upload.h"
#include "worker/persist_executor.h"
#include "worker/transfer_serve.h"
#include "worker/transfer_verify.h"

ABSL_FLAG(std::string, persist_gate_file, "",
          "tests only (testonly daemon): before writing a background-persistence item, create "
          "FILE.waiting and wait until FILE exists");

ABSL_FLAG(std::string, upload_gate_file, "",
          "tests only (testonly daemon): before a rank uploads the files of a save or reshard "
          "to an object store, create FILE.waiting and wait until FILE exists");

namespace ckpt::worker {

void CorruptSentUnitsForTest(const pb::LoadPlanPart& part, const ExchangePlan& plan, int me,
                             ShardBuffers* loaded) {
  const char* flag = std::getenv("CKPT_TEST_CORRUPT_SENT_UNITS");
  if (!part.transfer_verify() || flag == nullptr || std::string(flag) != "1") return;
  for (const DistributedPiece& d : plan.distribution) {
    if (d.main_rank != me) continue;
    auto it = loaded->find(d.spec.id);
    if (it != loaded->end() && !it->second.empty()) it->second[0] ^= 0x01;
  }
}

void HoldServingForTest(const MemoryGate& gate, const absl::Notification* stopping) {
  const char* dir = std::getenv("CKPT_TEST_SERVE_HOLD_DIR");
  struct stat st;
  if (dir == nullptr || stat(absl::StrCat(dir, "/hold").c_str(), &st) != 0) return;
  std::ofstream(absl::StrCat(dir, "/held.", getpid())) << "held\n";
  while (!gate.closed() && (stopping == nullptr || !stopping->HasBeenNotified())) {
    absl::SleepFor(absl::Milliseconds(20));
  }
}

bool PassUploadGateForTest(const std::function<bool()>& cancelled) {
  const std::string gate_file = absl::GetFlag(FLAGS_upload_gate_file);
  if (gate_file.empty()) return true;
  std::ofstream(absl::StrCat(gate_file, ".waiting")).flush();  // "this upload waits"
  while (access(gate_file.c_str(), F_OK) != 0) {
    if (cancelled && cancelled()) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return true;
}

bool PassPersistGateForTest(const std::function<bool(absl::Duration)>& stopped_within) {
  const std::string gate_file = absl::GetFlag(FLAGS_persist_gate_file);
  if (gate_file.empty()) return true;
  std::ofstream(absl::StrCat(gate_file, ".waiting")).flush();  // "this item waits"
  while (access(gate_file.c_str(), F_OK) != 0) {
    if (stopped_within(absl::Milliseconds(50))) return false;
  }
  return true;
}

}  // namespace ckpt::worker
