// ckpt_worker: the worker daemon, one per GPU (or CPU rank). Registers with the coordinator
// and keeps its lease, serves the trainer-facing Worker service on a unix socket, and releases
// the shared-memory segments of trainer processes that die.
//
//   ckpt_worker --coordinator HOST:PORT [--listen unix:/path] [--local_rank N] [--gpu G]
//               [--host NAME] [--data_plane_address ADDR] [--log_level info]
//               [--ready_file F] [--gloo_loop_nice 10] [--trainer_uids U,...]
//               [--communicator_cache_entries 16]
//               [--pinned_staging_bytes N] [--staging_chunk_bytes N]
//               [--host_pool_bytes N] [--host_pool_prefault] [--save_direct_io=false]
//               [--object_scratch_dir DIR] [--object_upload_timeout_s 3600]
//               [--tls_ca F --tls_cert F --tls_key F | --insecure]
//
// The trainers' socket is private to this uid (mode 0600) unless --trainer_uids allows
// others; who connected is taken from the kernel (SO_PEERCRED). The link to the coordinator
// (and the data plane's rendezvous) uses TLS with the worker's certificate when --tls_* are
// given; without them the coordinator must be on loopback, or --insecure given.
//
// The local rank (and with it the default socket and GPU) comes from --local_rank, else the
// launcher's environment (LOCAL_RANK, SLURM_LOCALID, OMPI_COMM_WORLD_LOCAL_RANK), else 0.
// Prints "ckpt_worker listening on unix:/path" on stdout once serving, and writes
// "<worker_id> <address>" to --ready_file after the first registration.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/daemon.h"
#include "common/durable_file.h"
#include "common/launcher_env.h"
#include "common/status_macros.h"
#include "common/transport_security.h"
#include "device/cuda_copy_engine.h"
#include "device/device_uuid.h"
#include "device/gpu.h"
#include "exchange/nccl/nccl_communicator.h"
#include "spdlog/spdlog.h"
#include "worker/coordinator_link.h"
#include "worker/host_buffer_pool.h"
#include "worker/load_communicator.h"
#include "worker/memory_registry.h"
#include "worker/memory_tier.h"
#include "worker/persist_executor.h"
#include "worker/staging_pipeline.h"
#include "worker/trainer_socket.h"
#include "worker/worker_service.h"

ABSL_FLAG(std::string, coordinator, "", "the coordinator's host:port (required)");
ABSL_FLAG(
    std::string, listen, "",
    "unix:/path to serve trainers on (default unix:/tmp/ckpt-worker-<uid>-<local_rank>.sock)");
ABSL_FLAG(int, local_rank, -1,
          "local rank on this host (default: from the launcher's env, else 0)");
ABSL_FLAG(int, gpu, -2,
          "GPU ordinal whose device tensors this worker serves; -1 for none (default: local_rank "
          "modulo the GPU count, host memory only when no GPU is usable)");
ABSL_FLAG(bool, nccl, true,
          "advertise NCCL (when a GPU is served and the NCCL library loads): loads whose ranks "
          "are all device-resident then exchange over NCCL on the device; false: always Gloo");
ABSL_FLAG(int64_t, pinned_staging_bytes, int64_t{512} << 20,
          "page-locked host memory this worker stages device tensors through (allocated at the "
          "first device save or load, reused afterwards); a larger state still saves, its Save "
          "returns later");
ABSL_FLAG(int64_t, staging_chunk_bytes, int64_t{8} << 20,
          "bytes of one device<->host staging copy");
ABSL_FLAG(int64_t, host_pool_bytes, int64_t{1} << 30,
          "host memory storage saves copy the trainer's host tensors into (in 8 MiB chunks, "
          "mapped and touched once as saves need them, then reused by every save and never "
          "given back): a save up to this size returns at memcpy speed, a larger one waits for "
          "its writes to free chunks; 0: no pool, each save copies into new memory");
ABSL_FLAG(bool, host_pool_prefault, false,
          "map and touch the whole host pool at start, so that the first save is as fast as "
          "later ones");
ABSL_FLAG(bool, save_direct_io, true,
          "write saves' data files with O_DIRECT where the filesystem allows (buffered where it "
          "refuses)");
ABSL_FLAG(std::string, object_scratch_dir, "",
          "where a save to an object store URL (s3://...) writes each rank's data files before "
          "uploading them (default: $TMPDIR, else /tmp)");
ABSL_FLAG(int64_t, object_upload_timeout_s, 3600,
          "how long one rank's upload of a save to an object store may take");
ABSL_FLAG(std::string, host, "", "host name to announce (default: this machine's)");
ABSL_FLAG(std::string, data_plane_address, "",
          "address this worker's data plane (Gloo) binds to and peers reach it on (default: the "
          "host name's address; ports are exchanged through the coordinator's rendezvous "
          "store). Data-plane traffic is not authenticated: use an address on an isolated "
          "network");
ABSL_FLAG(std::string, trainer_uids, "",
          "comma-separated uids whose trainers may connect besides this worker's own uid (the "
          "socket's mode is then 0666 and callers are judged by their uid from SO_PEERCRED)");
ABSL_FLAG(std::string, tls_ca, "",
          "CA certificate (PEM) the coordinator's certificate must chain to");
ABSL_FLAG(std::string, tls_cert, "",
          "this worker's certificate (PEM; ckptctl certs issue --role worker)");
ABSL_FLAG(std::string, tls_key, "", "this worker's private key (PEM, mode 0600)");
ABSL_FLAG(bool, insecure, false,
          "talk to a coordinator beyond loopback without TLS (anyone on the network could "
          "impersonate either side)");
ABSL_FLAG(int, gloo_loop_nice, 10,
          "added to the nice value of Gloo's event-loop thread in load exchanges (0: unchanged); "
          "keeps its busy-polling from starving the thread it waits on when ranks outnumber cores");
ABSL_FLAG(int, communicator_cache_entries,
          static_cast<int>(ckpt::worker::kSharedCommunicatorCacheEntries),
          "data-plane communicators kept between operations, so that the next load, transfer "
          "or memory save of the same ranks skips the rendezvous (0: join anew every time)");
ABSL_FLAG(int64_t, memory_tier_bytes, int64_t{1} << 30,
          "bytes of memory checkpoints (mem://<name>: this worker's ranks' data files and the "
          "replicas it keeps for other hosts) this worker holds at most (0: no memory tier)");
ABSL_FLAG(int, memory_tier_keep, 2,
          "complete memory checkpoints kept; older ones are evicted (at least 1)");
ABSL_FLAG(std::string, log_level, "info", "trace, debug, info, warn, error, critical or off");
ABSL_FLAG(std::string, ready_file, "",
          "when set, \"<worker_id> <listen address>\" is written here after registering");
ABSL_FLAG(int64_t, rpc_timeout_ms, 5000, "deadline of each call to the coordinator");
ABSL_FLAG(int64_t, join_linger_ms,
          absl::ToInt64Milliseconds(ckpt::worker::WorkerService::kDefaultJoinLinger),
          "how long a join waits for the job's other ranks on this worker, so that they join "
          "the coordinator in one call (0: never)");
ABSL_FLAG(int64_t, reap_interval_ms, 250, "how often dead trainers' segments are looked for");
ABSL_FLAG(int64_t, max_open_files, 0,
          "the soft open-files limit (RLIMIT_NOFILE) to run with (0: the hard limit; the data "
          "plane's connections to other workers need many at scale)");

namespace {

int Fail(const std::string& message) {
  std::fprintf(stderr, "ckpt_worker: %s\n", message.c_str());
  return 2;
}

// --trainer_uids as numbers.
absl::StatusOr<std::vector<uid_t>> TrainerUids(const std::string& text) {
  std::vector<uid_t> uids;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    uint32_t uid = 0;
    if (!absl::SimpleAtoi(part, &uid)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--trainer_uids: '", part, "' is not a numeric uid"));
    }
    uids.push_back(static_cast<uid_t>(uid));
  }
  return uids;
}

// Serves `service` to trainers over `socket` (connections handed over as they are accepted).
std::unique_ptr<grpc::Server> StartTrainerServer(ckpt::worker::WorkerService* service,
                                                 ckpt::worker::TrainerSocket* socket) {
  service->set_trainer_socket(socket);
  grpc::ServerBuilder builder;
  // A state dict of many tensors easily exceeds gRPC's 4 MB default.
  builder.SetMaxReceiveMessageSize(1 << 30);
  builder.SetMaxSendMessageSize(1 << 30);
  builder.RegisterService(service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server != nullptr) socket->Serve(server.get());
  return server;
}

// What the worker announces about the GPU it serves beyond the ordinal.
struct ServedDevice {
  std::string uuid;  // device tensors are matched by it (the trainer's ordinal may differ)
  std::string no_nccl_reason = "no GPU served";  // empty: NCCL communicators can be created
};

// Reads `gpu`'s UUID (an error stops the worker: it could match no device tensor) and whether
// NCCL works (unless `nccl_flag` is false).
absl::StatusOr<ServedDevice> DescribeServedDevice(int gpu, bool nccl_flag) {
  ServedDevice served;
  absl::StatusOr<std::string> uuid = ckpt::DeviceUuid(gpu);
  if (!uuid.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("GPU ", gpu, ": cannot read its UUID: ", uuid.status().message()));
  }
  served.uuid = *std::move(uuid);
  served.no_nccl_reason = "--nccl=false";
  if (nccl_flag) {
    absl::StatusOr<int> version = ckpt::NcclVersion();
    served.no_nccl_reason = version.ok() ? "" : std::string(version.status().message());
  }
  return served;
}

// The GPU this worker serves, if any: device memory is advertised only when the worker can
// really serve it (the GPU exists, takes a context and the copy engine's streams were created).
struct DeviceServing {
  int gpu = -1;
  std::unique_ptr<ckpt::CudaCopyEngine> copy_engine;  // null: host memory only
  std::unique_ptr<ckpt::worker::PinnedStagingPool> staging;
  ServedDevice served;
  std::string no_device_reason;
};

// Picks the GPU (--gpu, else the local rank's) and opens it. An explicit --gpu that cannot be
// served is an error; an implicit one falls back to host memory with the reason kept.
absl::StatusOr<DeviceServing> ServeDevice(int local_rank) {
  DeviceServing d;
  const int gpu_flag = absl::GetFlag(FLAGS_gpu);
  d.gpu = gpu_flag < -1 ? ckpt::GpuForLocalRank(local_rank) : gpu_flag;
  d.no_device_reason = gpu_flag == -1 ? "--gpu -1" : "";
  if (d.gpu >= 0) {
    absl::Status usable = ckpt::CheckDeviceUsable(d.gpu);
    if (usable.ok()) {
      absl::StatusOr<std::unique_ptr<ckpt::CudaCopyEngine>> engine =
          ckpt::CudaCopyEngine::Create(d.gpu);
      if (engine.ok()) d.copy_engine = *std::move(engine);
      usable = engine.status();
    }
    if (!usable.ok()) {
      if (gpu_flag >= 0) {
        return absl::FailedPreconditionError(
            absl::StrCat("--gpu ", gpu_flag, " cannot be served: ", usable.message()));
      }
      d.no_device_reason = absl::StrCat("GPU ", d.gpu, " is not usable: ", usable.message());
      d.gpu = -1;
    }
  } else if (d.no_device_reason.empty()) {
    absl::StatusOr<int> gpus = ckpt::CudaDeviceCount();
    d.no_device_reason =
        gpus.ok() ? "no GPU for this local rank" : std::string(gpus.status().message());
  }
  if (d.copy_engine == nullptr) return d;
  CKPT_ASSIGN_OR_RETURN(d.served, DescribeServedDevice(d.gpu, absl::GetFlag(FLAGS_nccl)));
  d.staging = std::make_unique<ckpt::worker::PinnedStagingPool>(
      d.copy_engine.get(), absl::GetFlag(FLAGS_pinned_staging_bytes),
      absl::GetFlag(FLAGS_staging_chunk_bytes));
  return d;
}

// What the worker registers with the coordinator.
ckpt::worker::LinkOptions MakeLinkOptions(const std::string& coordinator,
                                          const ckpt::TransportSecurity& security,
                                          const std::string& host, int local_rank,
                                          const DeviceServing& device) {
  ckpt::worker::LinkOptions link_options;
  link_options.coordinator = coordinator;
  link_options.security = security;
  link_options.rpc_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_rpc_timeout_ms));
  std::string data_plane = absl::GetFlag(FLAGS_data_plane_address);
  if (data_plane.empty()) data_plane = host;
  ckpt::pb::WorkerInfo& info = link_options.info;
  info.set_host(host);
  info.set_pid(getpid());
  info.set_data_plane_address(data_plane);
  info.add_memory_kinds(ckpt::pb::MEMORY_HOST);
  if (device.gpu >= 0) info.add_memory_kinds(ckpt::pb::MEMORY_DEVICE);
  info.set_local_rank(local_rank);
  info.set_gpu(device.gpu);
  info.set_nccl(device.gpu >= 0 && device.served.no_nccl_reason.empty());
  return link_options;
}

void LogDevice(const DeviceServing& d) {
  if (d.gpu < 0) {
    spdlog::info("no_gpu reason=\"{}\" memory_kinds=host", d.no_device_reason);
    return;
  }
  spdlog::info(
      "device_staging gpu={} uuid={} engine=\"{}\" pinned_bytes={} chunk_bytes={} buffers={} "
      "nccl={}",
      d.gpu, ckpt::FormatDeviceUuid(d.served.uuid), std::string(d.copy_engine->name()),
      d.staging->capacity_bytes(), d.staging->chunk_bytes(), d.staging->num_buffers(),
      d.served.no_nccl_reason.empty() ? "yes" : absl::StrCat("no (", d.served.no_nccl_reason, ")"));
}

// Until `stop`: releases the memory of trainers that died, and sweeps orphan segments of
// trainers that died while no worker served them (at start, then every 10 s).
void ReapUntilStopped(ckpt::worker::MemoryRegistry* registry, ckpt::worker::WorkerService* service,
                      std::vector<uid_t> trainer_uids, absl::Notification* stop) {
  const absl::Duration interval = absl::Milliseconds(absl::GetFlag(FLAGS_reap_interval_ms));
  ckpt::worker::ProcfsProcessProbe probe;
  absl::Time next_sweep = absl::InfinitePast();
  do {
    if (absl::Now() >= next_sweep) {
      for (const std::string& name : ckpt::worker::SweepOrphanSegments(probe, trainer_uids)) {
        spdlog::warn("orphan_segment_removed name={}", name);
      }
      next_sweep = absl::Now() + absl::Seconds(10);
    }
    for (const ckpt::worker::SessionInfo& gone : registry->ReapDeadTrainers()) {
      spdlog::warn("trainer_gone session={} job={} rank={} pid={} segments_released={}", gone.id,
                   gone.trainer.job, gone.trainer.rank, gone.trainer.pid, gone.segments.size());
      service->OnTrainerGone(gone);
    }
  } while (!stop->WaitForNotificationWithTimeout(interval));
}

// The settings that need checking before anything starts.
struct Settings {
  std::string coordinator, listen, host;
  int local_rank = 0;
  ckpt::TransportSecurity security;
  std::vector<uid_t> trainer_uids;
};

// --host_pool_bytes: 0 (no pool) or a byte count this machine's memory can hold (absl's flag
// parsing refuses what is not a number, naming the flag). Errors name the flag and the value.
absl::Status CheckHostPoolFlags() {
  const int64_t bytes = absl::GetFlag(FLAGS_host_pool_bytes);
  if (bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--host_pool_bytes must be 0 (no pool) or a positive number of bytes, got ", bytes));
  }
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0 && bytes / page > pages) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--host_pool_bytes=", bytes, " exceeds this machine's memory (",
        static_cast<int64_t>(pages) * page, " bytes)",
        absl::GetFlag(FLAGS_host_pool_prefault) ? "; --host_pool_prefault would map all of it"
                                                : ""));
  }
  return absl::OkStatus();
}

absl::StatusOr<Settings> ReadSettings() {
  CKPT_RETURN_IF_ERROR(CheckHostPoolFlags());
  Settings s;
  s.coordinator = absl::GetFlag(FLAGS_coordinator);
  if (s.coordinator.empty()) {
    return absl::InvalidArgumentError("--coordinator HOST:PORT is required");
  }
  std::optional<int> explicit_local_rank;
  if (absl::GetFlag(FLAGS_local_rank) >= 0) explicit_local_rank = absl::GetFlag(FLAGS_local_rank);
  CKPT_ASSIGN_OR_RETURN(s.local_rank,
                        ckpt::ResolveLocalRank(explicit_local_rank, ckpt::ProcessEnv()));
  s.listen = absl::GetFlag(FLAGS_listen);
  if (s.listen.empty()) s.listen = ckpt::DefaultWorkerAddress(s.local_rank);
  if (!absl::StartsWith(s.listen, "unix:/")) {
    return absl::InvalidArgumentError(
        absl::StrCat("--listen must be unix:/absolute/path, got \"", s.listen, "\""));
  }
  s.host = absl::GetFlag(FLAGS_host);
  if (s.host.empty()) s.host = ckpt::HostName();
  CKPT_ASSIGN_OR_RETURN(s.trainer_uids, TrainerUids(absl::GetFlag(FLAGS_trainer_uids)));
  const int cache_entries = absl::GetFlag(FLAGS_communicator_cache_entries);
  if (cache_entries < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--communicator_cache_entries must be 0 (join anew every time) or more, got ",
                     cache_entries));
  }
  ckpt::worker::SetSharedCommunicatorCacheEntries(static_cast<size_t>(cache_entries));
  return s;
}

// Background persistence of memory checkpoints (its executor, for `service`'s work items), and
// the tier's evictions reported to the catalog by heartbeat. `tier` must outlive the executor.
std::unique_ptr<ckpt::worker::PersistExecutor> StartPersistence(
    ckpt::worker::MemoryTier* const* tier, ckpt::worker::CoordinatorLink& link,
    ckpt::worker::WorkerService& service) {
  auto persist = std::make_unique<ckpt::worker::PersistExecutor>(tier, &link);
  service.set_persist_executor(persist.get());
  if (*tier != nullptr) {
    ckpt::worker::MemoryTier* held = *tier;
    link.SetEvictionSource([held] { return held->TakeEvicted(); });
    link.SetHeldMemorySource([held] { return ckpt::worker::DescribeHeld(*held); });
  }
  return persist;
}

// The memory tier of --memory_tier_bytes (null when 0).
std::unique_ptr<ckpt::worker::MemoryTier> MakeMemoryTier(const std::string& host) {
  if (absl::GetFlag(FLAGS_memory_tier_bytes) <= 0) return nullptr;
  return std::make_unique<ckpt::worker::MemoryTier>(ckpt::worker::MemoryTierOptions{
      absl::GetFlag(FLAGS_memory_tier_bytes), std::max(1, absl::GetFlag(FLAGS_memory_tier_keep)),
      absl::StrCat("worker on host ", host, " (pid ", getpid(), ")")});
}

// The host pool of --host_pool_bytes (null for 0), prefaulted with --host_pool_prefault (a
// failure to map is logged; saves then map chunks as they go).
std::unique_ptr<ckpt::worker::HostBufferPool> MakeHostPool() {
  const int64_t bytes = absl::GetFlag(FLAGS_host_pool_bytes);
  if (bytes <= 0) return nullptr;
  auto pool = std::make_unique<ckpt::worker::HostBufferPool>(bytes);
  if (absl::GetFlag(FLAGS_host_pool_prefault)) {
    const absl::Time start = absl::Now();
    if (absl::Status s = pool->Prefault(); !s.ok())
      spdlog::warn("host_pool_prefault {}", s.ToString());
    spdlog::info("host_pool_prefaulted bytes={} seconds={:.3f} huge_pages={}",
                 pool->stats().bytes_mapped, absl::ToDoubleSeconds(absl::Now() - start),
                 pool->stats().huge_pages);
  }
  return pool;
}

// The service's settings from the flags: the Gloo loop's niceness, the memory tier and host
// pool (may be null), and how saves to an object store stage and upload.
void ConfigureService(ckpt::worker::MemoryTier* memory_tier, ckpt::worker::HostBufferPool* pool,
                      ckpt::worker::WorkerService& service) {
  service.set_gloo_loop_thread_nice(absl::GetFlag(FLAGS_gloo_loop_nice));
  if (memory_tier != nullptr) service.set_memory_tier(memory_tier);
  service.set_host_pool(pool, absl::GetFlag(FLAGS_save_direct_io));
  service.set_object_uploads(
      absl::GetFlag(FLAGS_object_scratch_dir),
      absl::Seconds(std::max<int64_t>(absl::GetFlag(FLAGS_object_upload_timeout_s), 1)));
}

int Run() {
  if (absl::Status s = ckpt::SetUpDaemonLogging("worker", absl::GetFlag(FLAGS_log_level));
      !s.ok()) {
    return Fail(std::string(s.message()));
  }
  absl::StatusOr<Settings> settings = ReadSettings();
  if (!settings.ok()) return Fail(std::string(settings.status().message()));
  absl::StatusOr<int64_t> open_files = ckpt::SetOpenFilesLimit(absl::GetFlag(FLAGS_max_open_files));
  if (!open_files.ok()) spdlog::warn("open_files_limit {}", open_files.status().ToString());
  absl::StatusOr<DeviceServing> device = ServeDevice(settings->local_rank);
  if (!device.ok()) return Fail(std::string(device.status().message()));
  absl::StatusOr<ckpt::TransportSecurity> security = ckpt::ResolveTransportSecurity(
      {absl::GetFlag(FLAGS_tls_ca), absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key)},
      absl::GetFlag(FLAGS_insecure), settings->coordinator, "--coordinator", "ckpt_worker");
  if (!security.ok()) {  // the message names the program already
    std::fprintf(stderr, "%s\n", std::string(security.status().message()).c_str());
    return 2;
  }
  if (security->insecure_beyond_loopback) {
    spdlog::critical("{}", ckpt::InsecureWarning("ckpt_worker", settings->coordinator));
  }
  LogDevice(*device);

  ckpt::worker::MemoryRegistry registry;
  ckpt::worker::CoordinatorLink link(MakeLinkOptions(
      settings->coordinator, *security, settings->host, settings->local_rank, *device));
  if (device->staging != nullptr) registry.ServeDevice(device->gpu, device->served.uuid);
  // Declared before the service, which runs the parts that use it.
  std::unique_ptr<ckpt::worker::MemoryTier> memory_tier = MakeMemoryTier(settings->host);
  std::unique_ptr<ckpt::worker::HostBufferPool> host_pool = MakeHostPool();
  ckpt::worker::WorkerService service(
      &registry, &link, settings->host, device->staging.get(),
      absl::Milliseconds(std::max<int64_t>(absl::GetFlag(FLAGS_join_linger_ms), 0)));
  ConfigureService(memory_tier.get(), host_pool.get(), service);
  ckpt::worker::MemoryTier* const tier = memory_tier.get();
  std::unique_ptr<ckpt::worker::PersistExecutor> persist = StartPersistence(&tier, link, service);
  const std::string ready_file = absl::GetFlag(FLAGS_ready_file);
  const std::string listen = settings->listen;
  link.SetRegisteredHandler([&service, ready_file, listen](const std::string& worker_id) {
    service.OnRegistered(worker_id);
    if (ready_file.empty()) return;
    absl::Status s = ckpt::WriteFileAtomically(ready_file, worker_id + " " + listen + "\n");
    if (!s.ok()) spdlog::error("cannot write ready_file={}: {}", ready_file, s.ToString());
  });
  link.SetWorkHandler([&service](const ckpt::pb::WorkItem& item) { service.OnWorkItem(item); });
  link.SetLeaseLostHandler([&service](const absl::Status& why) { service.OnLeaseLost(why); });

  // A stale socket of a previous, killed worker is replaced; nothing else is removed.
  absl::StatusOr<std::unique_ptr<ckpt::worker::TrainerSocket>> socket =
      ckpt::worker::TrainerSocket::Open({listen.substr(5), settings->trainer_uids});
  if (!socket.ok()) return Fail(std::string(socket.status().message()));
  std::unique_ptr<grpc::Server> server = StartTrainerServer(&service, socket->get());
  if (server == nullptr) return Fail(absl::StrCat("cannot serve on ", listen));
  std::printf("ckpt_worker listening on %s\n", listen.c_str());
  std::fflush(stdout);
  spdlog::info("serving address={} coordinator={} tls={} host={} local_rank={} gpu={}", listen,
               settings->coordinator, security->tls, settings->host, settings->local_rank,
               device->gpu);
  link.Start();

  absl::Notification stop;
  std::thread reaper(ReapUntilStopped, &registry, &service, settings->trainer_uids, &stop);
  grpc::Server* raw = server.get();
  ckpt::worker::TrainerSocket* trainer_socket = socket->get();
  ckpt::WatchShutdownSignals([raw, trainer_socket](int signal_number) {
    spdlog::info("shutting_down signal={}", signal_number);
    trainer_socket->Stop();  // no new trainer connections, socket file removed
    raw->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  });
  server->Wait();
  stop.Notify();
  reaper.join();
  link.Stop(/*deregister=*/true);
  service.Shutdown();  // running plan parts stop at their next step
  trainer_socket->Stop();
  spdlog::info("stopped");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "ckpt worker daemon: one per GPU; serves trainers on a unix socket.\n"
      "usage: ckpt_worker --coordinator HOST:PORT [flags]");
  absl::ParseCommandLine(argc, argv);
  ckpt::BlockShutdownSignals();
  ckpt::TurnOffMutexDeadlockDetection();
  return Run();
}
