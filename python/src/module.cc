// ckpt._ckpt: the Python extension over the C++ client library (client/). The public Python
// API (ckpt.Client, ckpt.Box, ckpt.empty, ...) is written in Python on top of these private
// types; see python/ckpt/__init__.py. Every blocking call releases the GIL; every error is a
// ckpt.Error (python/src/errors.h).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "client/options.h"
#include "client/shared_memory.h"
#include "client/state_dict.h"
#include "python/src/compact_view.h"
#include "python/src/errors.h"
#include "python/src/manifest_view.h"
#include "sharding/dtype.h"

namespace nb = nanobind;

namespace ckpt::python {
namespace {

using client::DTensorLayout;
using client::SharedAllocator;
using client::TensorDeclaration;
using Layout = std::variant<Region, DTensorLayout, FlatRange>;

// A layout as the Python classes build it (ckpt.Box, ckpt.Flat, ckpt.DTensorLayout...).
struct PyLayout {
  Layout layout;
};

PyLayout BoxLayout(std::vector<int64_t> offsets, std::vector<int64_t> lengths,
                   std::optional<std::tuple<int64_t, int64_t>> flat) {
  Region region{std::move(offsets), std::move(lengths), std::nullopt};
  if (flat) region.flat = FlatRange{std::get<0>(*flat), std::get<1>(*flat)};
  return PyLayout{std::move(region)};
}

PyLayout FlatLayout(int64_t start, int64_t stop) { return PyLayout{FlatRange{start, stop}}; }

// `placements`: one per mesh dim, the tensor dim for Shard(dim), None for Replicate().
PyLayout MeshLayout(std::vector<int64_t> mesh_shape, std::vector<std::optional<int>> placements,
                    int64_t mesh_rank) {
  DTensorLayout d;
  d.mesh_shape = std::move(mesh_shape);
  for (const std::optional<int>& p : placements) {
    d.placements.push_back(p ? Placement::Shard(*p) : Placement::Replicate());
  }
  d.mesh_rank = mesh_rank;
  return PyLayout{std::move(d)};
}

TensorDeclaration MakeSpec(const std::string& key, const std::string& dtype,
                           std::vector<int64_t> global_shape, const PyLayout& layout,
                           std::vector<int64_t> replica_id) {
  TensorDeclaration spec;
  spec.key = key;
  absl::StatusOr<DType> parsed = ParseDType(dtype);
  if (!parsed.ok()) {
    throw StatusError{
        absl::InvalidArgumentError(absl::StrCat("tensor ", key, ": ", parsed.status().message()))};
  }
  spec.dtype = *parsed;
  spec.global_shape = std::move(global_shape);
  spec.layout = layout.layout;
  spec.replica_id = std::move(replica_id);
  return spec;
}

using ResolvedRegion =
    std::tuple<std::vector<int64_t>, std::vector<int64_t>,
               std::optional<std::tuple<int64_t, int64_t>>, std::vector<int64_t>>;

// ckpt's own sharding rules (client::ResolveLayout): the region and replica id of `rank`.
ResolvedRegion Resolve(const std::string& key, std::vector<int64_t> global_shape,
                       const PyLayout& layout, std::vector<int64_t> replica_id, int rank) {
  TensorDeclaration spec =
      MakeSpec(key, "U8", std::move(global_shape), layout, std::move(replica_id));
  auto [region, replica] = ValueOrThrow(client::ResolveLayout(spec, rank));
  std::optional<std::tuple<int64_t, int64_t>> flat;
  if (region.flat) flat = std::make_tuple(region.flat->start, region.flat->stop);
  return {region.offsets, region.lengths, flat, replica};
}

// A 1-d uint8 NumPy array over `allocation`, which the array keeps alive.
nb::ndarray<nb::numpy, uint8_t, nb::ndim<1>> ArrayOver(SharedAllocator::Allocation allocation) {
  auto* owned = new SharedAllocator::Allocation(std::move(allocation));
  nb::capsule owner(owned,
                    [](void* p) noexcept { delete static_cast<SharedAllocator::Allocation*>(p); });
  size_t shape[1] = {owned->size};
  return nb::ndarray<nb::numpy, uint8_t, nb::ndim<1>>(owned->data(), 1, shape, owner);
}

// ckpt.empty's memory: `nbytes` zero-filled bytes in worker-shared memory.
nb::ndarray<nb::numpy, uint8_t, nb::ndim<1>> Allocate(int64_t nbytes, const std::string& what) {
  if (nbytes < 0) throw StatusError{absl::InvalidArgumentError("negative allocation size")};
  std::optional<SharedAllocator::Allocation> allocation;
  {
    nb::gil_scoped_release release;
    allocation =
        ValueOrThrow(SharedAllocator::ForThisProcess().Allocate(static_cast<size_t>(nbytes), what));
  }
  return ArrayOver(*std::move(allocation));
}

// Memory PyTorch's share_memory_ placed in the shared-memory file `existing` and maps at
// [data, data + nbytes): registered as ckpt memory (a second name the worker maps), so state
// dicts save and load it in place. The returned array views it and keeps the registration;
// the caller keeps the torch storage alive as long as the array.
nb::ndarray<nb::numpy, uint8_t, nb::ndim<1>> AdoptSharedFile(const std::string& existing,
                                                             uintptr_t data, int64_t nbytes,
                                                             const std::string& what) {
  if (nbytes < 0) throw StatusError{absl::InvalidArgumentError("negative size")};
  std::optional<SharedAllocator::Allocation> allocation;
  {
    nb::gil_scoped_release release;
    allocation = ValueOrThrow(SharedAllocator::ForThisProcess().Adopt(
        existing, reinterpret_cast<void*>(data), static_cast<size_t>(nbytes), what));
  }
  return ArrayOver(*std::move(allocation));
}

bool IsShared(uintptr_t data, int64_t nbytes) {
  return SharedAllocator::ForThisProcess()
      .Find(reinterpret_cast<const void*>(data), static_cast<size_t>(nbytes))
      .has_value();
}

// A state dict: tensors in worker-shared memory, described to the worker at save/load.
class PyStateDict {
 public:
  explicit PyStateDict(std::unique_ptr<client::StateDict> state) : state_(std::move(state)) {}

  // Adds `key`. When [data, data + nbytes) lies in ckpt.empty memory the worker uses it in
  // place and this returns None; otherwise it returns a new shared staging array of `nbytes`
  // bytes that the caller copies the tensor into before a save (and out of after a load).
  std::optional<nb::ndarray<nb::numpy, uint8_t, nb::ndim<1>>> Add(
      const std::string& key, const std::string& dtype, std::vector<int64_t> global_shape,
      const PyLayout& layout, std::vector<int64_t> replica_id, uintptr_t data, int64_t nbytes) {
    TensorDeclaration spec =
        MakeSpec(key, dtype, std::move(global_shape), layout, std::move(replica_id));
    SharedAllocator& allocator = SharedAllocator::ForThisProcess();
    std::optional<SharedAllocator::Allocation> shared =
        nbytes > 0 ? allocator.Find(reinterpret_cast<const void*>(data), nbytes) : std::nullopt;
    const bool in_place = shared.has_value();
    if (!in_place) {
      nb::gil_scoped_release release;
      shared = ValueOrThrow(allocator.Allocate(static_cast<size_t>(nbytes), key));
    }
    client::StateTensor* added =
        ValueOrThrow(state_->AddHostView(spec, shared->segment, shared->offset, nbytes));
    if (in_place) return std::nullopt;
    // The staging is ckpt's own: the Python StateDict does not write it while a save of it runs
    // (it waits for that save to end), so saves lend it to the worker instead of it being copied.
    added->lent_until_durable = true;
    return ArrayOver(*std::move(shared));
  }

  // Adds `key` in CUDA memory at `data` on `device`: the worker opens the allocation's CUDA IPC
  // handle and saves from / loads into it directly (client::StateDict::AddDevice).
  void AddDevice(const std::string& key, const std::string& dtype,
                 std::vector<int64_t> global_shape, const PyLayout& layout,
                 std::vector<int64_t> replica_id, uintptr_t data, int device) {
    TensorDeclaration spec =
        MakeSpec(key, dtype, std::move(global_shape), layout, std::move(replica_id));
    ValueOrThrow(state_->AddDevice(spec, reinterpret_cast<void*>(data), device));
  }

  std::vector<std::string> Keys() const {
    std::vector<std::string> keys;
    for (const auto& t : state_->tensors()) keys.push_back(t->key);
    return keys;
  }

  client::StateDict& get() { return *state_; }

 private:
  std::unique_ptr<client::StateDict> state_;
};

// Where a save stands (SaveHandle.progress()).
nb::dict ProgressDict(const client::OperationProgress& p) {
  nb::dict d;
  d["phase"] = p.phase;
  d["bytes_done"] = p.bytes_done;
  d["bytes_total"] = p.bytes_total;
  d["snapshotted"] = p.snapshotted;
  d["code"] = static_cast<int>(p.status.code());
  d["message"] = std::string(p.status.message());
  return d;
}

class PySaveHandle {
 public:
  explicit PySaveHandle(std::unique_ptr<client::SaveHandle> handle) : handle_(std::move(handle)) {}
  std::string OperationId() const { return handle_->operation_id(); }
  // How this rank's worker took the snapshot (client::SnapshotInfo).
  nb::dict Snapshot() const {
    const client::SnapshotInfo& s = handle_->snapshot();
    nb::dict d;
    d["copied_bytes"] = s.copied_bytes;
    d["lent_bytes"] = s.lent_bytes;
    d["device_bytes"] = s.device_bytes;
    d["device_over_pinned_budget"] = s.device_over_pinned_budget;
    d["pinned_budget_bytes"] = s.pinned_budget_bytes;
    d["snapshot_waited_for_writes"] = s.snapshot_waited_for_writes;
    d["bytes_written_before_snapshot"] = s.bytes_written_before_snapshot;
    return d;
  }
  void Wait(double timeout_s) {
    nb::gil_scoped_release release;
    ThrowIfError(handle_->WaitDurable(absl::Seconds(timeout_s)));
  }
  nb::dict Progress() {
    std::optional<client::OperationProgress> p;
    {
      nb::gil_scoped_release release;
      p = ValueOrThrow(handle_->Progress());
    }
    return ProgressDict(*p);
  }

 private:
  std::unique_ptr<client::SaveHandle> handle_;
};

// A publish in flight (client::PublishHandle).
class PyPublishHandle {
 public:
  explicit PyPublishHandle(std::unique_ptr<client::PublishHandle> handle)
      : handle_(std::move(handle)) {}
  int64_t Version() const { return handle_->version(); }
  std::string OperationId() const { return handle_->operation_id(); }
  void Wait(double timeout_s) {
    nb::gil_scoped_release release;
    ThrowIfError(handle_->WaitPublished(absl::Seconds(timeout_s)));
  }

 private:
  std::unique_ptr<client::PublishHandle> handle_;
};

client::Options MakeOptions(std::optional<std::string> job, std::optional<int> rank,
                            std::optional<int> world_size, std::optional<int> local_rank,
                            std::optional<std::string> worker_address, double rpc_timeout_s) {
  client::Options o;
  o.job = std::move(job);
  o.rank = rank;
  o.world_size = world_size;
  o.local_rank = local_rank;
  o.worker_address = std::move(worker_address);
  o.rpc_timeout = absl::Seconds(rpc_timeout_s);
  return o;
}

nb::dict ResolveOptionsDict(std::optional<std::string> job, std::optional<int> rank,
                            std::optional<int> world_size, std::optional<int> local_rank,
                            std::optional<std::string> worker_address) {
  client::ResolvedOptions r = ValueOrThrow(client::ResolveOptions(
      MakeOptions(job, rank, world_size, local_rank, worker_address, 10), client::ProcessEnv()));
  nb::dict d;
  d["job"] = r.job;
  d["rank"] = r.rank;
  d["world_size"] = r.world_size;
  d["local_rank"] = r.local_rank;
  d["worker_address"] = r.worker_address;
  d["launcher"] = r.launcher;
  return d;
}

class PyClient {
 public:
  static std::unique_ptr<PyClient> Connect(std::optional<std::string> job, std::optional<int> rank,
                                           std::optional<int> world_size,
                                           std::optional<int> local_rank,
                                           std::optional<std::string> worker_address,
                                           double rpc_timeout_s) {
    client::Options o =
        MakeOptions(job, rank, world_size, local_rank, worker_address, rpc_timeout_s);
    std::unique_ptr<client::Client> c;
    {
      nb::gil_scoped_release release;
      c = ValueOrThrow(client::Client::Connect(o));
    }
    return std::make_unique<PyClient>(std::move(c));
  }
  explicit PyClient(std::unique_ptr<client::Client> c) : client_(std::move(c)) {}

  client::Client& get() const {
    if (client_ == nullptr) {
      throw StatusError{absl::FailedPreconditionError("the ckpt client is closed")};
    }
    return *client_;
  }
  nb::dict Options() const {
    const client::ResolvedOptions& r = get().options();
    nb::dict d;
    d["job"] = r.job;
    d["rank"] = r.rank;
    d["world_size"] = r.world_size;
    d["local_rank"] = r.local_rank;
    d["worker_address"] = r.worker_address;
    d["launcher"] = r.launcher;
    d["worker_id"] = get().worker_id();
    d["worker_host"] = get().worker_host();
    d["session_id"] = get().session_id();
    return d;
  }
  std::unique_ptr<PyStateDict> NewStateDict() const {
    return std::make_unique<PyStateDict>(get().NewStateDict());
  }
  void Share(PyStateDict& state) {
    client::Client& c = get();
    nb::gil_scoped_release release;
    ThrowIfError(c.Share(state.get()));
  }
  std::unique_ptr<PySaveHandle> Save(const std::string& path, PyStateDict& state,
                                     std::map<std::string, std::string> metadata,
                                     double arrival_timeout_s, bool lend_all,
                                     const std::string& persist_to, bool persist_overwrite,
                                     int memory_replicas, const std::string& process_groups,
                                     const std::string& compression, bool overwrite) {
    client::Client& c = get();
    client::SaveOptions options;
    options.compression = compression;
    options.overwrite = overwrite;
    options.persist_to = persist_to;
    options.persist_overwrite = persist_overwrite;
    options.memory_replicas = memory_replicas;
    options.process_groups = process_groups;
    options.lending = lend_all ? client::Lending::kAllHostTensors : client::Lending::kMarkedTensors;
    options.metadata = std::move(metadata);
    options.arrival_timeout = absl::Seconds(arrival_timeout_s);
    std::unique_ptr<client::SaveHandle> handle;
    {
      nb::gil_scoped_release release;
      handle = ValueOrThrow(c.Save(path, state.get(), options));
    }
    return std::make_unique<PySaveHandle>(std::move(handle));
  }
  void Load(const std::string& path, PyStateDict& state, double arrival_timeout_s,
            double deadline_s, const std::string& algorithm, int64_t memory_budget_bytes,
            const std::string& process_groups) {
    client::Client& c = get();
    client::LoadOptions options;
    options.process_groups = process_groups;
    options.arrival_timeout = absl::Seconds(arrival_timeout_s);
    options.deadline = absl::Seconds(deadline_s);
    options.exchange_algorithm = algorithm;
    options.memory_budget_bytes = memory_budget_bytes;
    nb::gil_scoped_release release;
    ThrowIfError(c.Load(path, state.get(), options));
  }
  std::unique_ptr<PyPublishHandle> Publish(const std::string& name, PyStateDict& state,
                                           int64_t version,
                                           std::map<std::string, std::string> metadata,
                                           double arrival_timeout_s) {
    client::Client& c = get();
    client::PublishOptions options;
    options.version = version;
    options.metadata = std::move(metadata);
    options.arrival_timeout = absl::Seconds(arrival_timeout_s);
    std::unique_ptr<client::PublishHandle> handle;
    {
      nb::gil_scoped_release release;
      handle = ValueOrThrow(c.Publish(name, state.get(), options));
    }
    return std::make_unique<PyPublishHandle>(std::move(handle));
  }
  // Returns the version received.
  int64_t Receive(const std::string& name, PyStateDict& state, int64_t version, bool verify,
                  double arrival_timeout_s, double deadline_s, int64_t memory_budget_bytes,
                  const std::string& algorithm) {
    client::Client& c = get();
    client::ReceiveOptions options;
    options.exchange_algorithm = algorithm;
    options.version = version;
    options.verify = verify;
    options.arrival_timeout = absl::Seconds(arrival_timeout_s);
    options.deadline = absl::Seconds(deadline_s);
    options.memory_budget_bytes = memory_budget_bytes;
    nb::gil_scoped_release release;
    return ValueOrThrow(c.Receive(name, state.get(), options)).version;
  }
  std::optional<std::tuple<std::string, std::string, std::string>> Poll(PyStateDict& state,
                                                                        nb::callable prepare);
  void Close() {
    nb::gil_scoped_release release;
    client_.reset();  // says Goodbye
  }

 private:
  std::unique_ptr<client::Client> client_;
};

// Runs an operator-requested operation if one is pending: `prepare(kind, path)` runs first
// (with the GIL; its Python exception propagates). Returns (kind, path, operation id) or None.
std::optional<std::tuple<std::string, std::string, std::string>> PyClient::Poll(
    PyStateDict& state, nb::callable prepare) {
  client::Client& c = get();
  std::unique_ptr<nb::python_error> prepare_error;
  std::optional<client::PollResult> result;
  {
    nb::gil_scoped_release release;
    absl::StatusOr<client::PollResult> r =
        c.Poll(state.get(), [&](const std::string& kind, const std::string& path) {
          nb::gil_scoped_acquire acquire;
          try {
            prepare(kind, path);
          } catch (nb::python_error& e) {
            prepare_error = std::make_unique<nb::python_error>(std::move(e));
            return absl::AbortedError("prepare failed");
          }
          return absl::OkStatus();
        });
    if (prepare_error == nullptr) result = ValueOrThrow(std::move(r));
  }
  if (prepare_error != nullptr) throw std::move(*prepare_error);
  if (!result->performed) return std::nullopt;
  return std::make_tuple(result->kind, result->path, result->operation_id);
}

}  // namespace
}  // namespace ckpt::python

NB_MODULE(_ckpt, m) {
  using namespace ckpt::python;  // NOLINT: the module's own types
  m.doc() = "ckpt's C++ client library (private; use the ckpt package)";
  RegisterErrorTranslator();

  nb::class_<PyLayout>(m, "Layout");
  m.def("box_layout", &BoxLayout, nb::arg("offsets"), nb::arg("lengths"),
        nb::arg("flat") = nb::none());
  m.def("flat_layout", &FlatLayout, nb::arg("start"), nb::arg("stop"));
  m.def("mesh_layout", &MeshLayout, nb::arg("mesh_shape"), nb::arg("placements"),
        nb::arg("mesh_rank"));
  m.def("resolve_layout", &Resolve, nb::arg("key"), nb::arg("global_shape"), nb::arg("layout"),
        nb::arg("replica_id"), nb::arg("rank"));
  m.def("dtype_size", [](const std::string& name) {
    return ckpt::DTypeSize(ValueOrThrow(ckpt::ParseDType(name)));
  });
  m.def("allocate", &Allocate, nb::arg("nbytes"), nb::arg("what"));
  m.def("adopt_shared_file", &AdoptSharedFile, nb::arg("existing"), nb::arg("data"),
        nb::arg("nbytes"), nb::arg("what"));
  m.def("is_shared", &IsShared, nb::arg("data"), nb::arg("nbytes"));
  m.def("resolve_options", &ResolveOptionsDict, nb::arg("job") = nb::none(),
        nb::arg("rank") = nb::none(), nb::arg("world_size") = nb::none(),
        nb::arg("local_rank") = nb::none(), nb::arg("worker_address") = nb::none());
  m.def("read_manifest", &ReadManifestDict, nb::arg("path"));
  RegisterCompactView(m);

  nb::class_<PyStateDict>(m, "StateDict")
      .def("add", &PyStateDict::Add)
      .def("add_device", &PyStateDict::AddDevice)
      .def("keys", &PyStateDict::Keys)
      .def("description_bytes", [](PyStateDict& state) { return DescriptionBytes(state.get()); });
  nb::class_<PySaveHandle>(m, "SaveHandle")
      .def_prop_ro("operation_id", &PySaveHandle::OperationId)
      .def("wait", &PySaveHandle::Wait, nb::arg("timeout_s"))
      .def("snapshot", &PySaveHandle::Snapshot)
      .def("progress", &PySaveHandle::Progress);
  nb::class_<PyPublishHandle>(m, "PublishHandle")
      .def_prop_ro("version", &PyPublishHandle::Version)
      .def_prop_ro("operation_id", &PyPublishHandle::OperationId)
      .def("wait", &PyPublishHandle::Wait, nb::arg("timeout_s"));
  nb::class_<PyClient>(m, "Client")
      .def_static("connect", &PyClient::Connect, nb::arg("job") = nb::none(),
                  nb::arg("rank") = nb::none(), nb::arg("world_size") = nb::none(),
                  nb::arg("local_rank") = nb::none(), nb::arg("worker_address") = nb::none(),
                  nb::arg("rpc_timeout_s") = 10.0)
      .def("options", &PyClient::Options)
      .def("new_state_dict", &PyClient::NewStateDict)
      .def("share", &PyClient::Share)
      .def("save", &PyClient::Save, nb::arg("path"), nb::arg("state"), nb::arg("metadata"),
           nb::arg("arrival_timeout_s"), nb::arg("lend_all") = false, nb::arg("persist_to") = "",
           nb::arg("persist_overwrite") = false, nb::arg("memory_replicas") = -1,
           nb::arg("process_groups") = "", nb::arg("compression") = "",
           nb::arg("overwrite") = false)
      .def("load", &PyClient::Load, nb::arg("path"), nb::arg("state"), nb::arg("arrival_timeout_s"),
           nb::arg("deadline_s"), nb::arg("algorithm"), nb::arg("memory_budget_bytes"),
           nb::arg("process_groups") = "")
      .def("publish", &PyClient::Publish, nb::arg("name"), nb::arg("state"), nb::arg("version"),
           nb::arg("metadata"), nb::arg("arrival_timeout_s"))
      .def("receive", &PyClient::Receive, nb::arg("name"), nb::arg("state"), nb::arg("version"),
           nb::arg("verify"), nb::arg("arrival_timeout_s"), nb::arg("deadline_s"),
           nb::arg("memory_budget_bytes"), nb::arg("algorithm"))
      .def("poll", &PyClient::Poll, nb::arg("state"), nb::arg("prepare"))
      .def("close", &PyClient::Close);
}
