// Checkpoint stores, registered by URL scheme (issue 42 item 1; TensorStore's kvstore drivers
// are the model). A store is where committed checkpoints live and how they get there:
//
//   - a plain path or file:///path: a directory on a POSIX filesystem (storage/file_store.h),
//     committed by renaming a staging sibling into place;
//   - s3://bucket/prefix: an object store, which has no rename and no directory fsync, so data
//     objects go under a per-write prefix and the manifest is PUT last as the commit point.
//
// Every store offers the same three things, and nothing above this interface asks which store
// it has:
//   - CheckpointStore::BeginWrite: a CheckpointWrite whose objects stay invisible to readers until
//     Commit(manifest), the single commit point; Abort (or dropping the write) removes them. An
//     existing checkpoint is refused unless overwriting, and then stays readable, whole, until the
//     new one commits.
//   - CheckpointStore::Open: a committed checkpoint's manifest and ranged reads of its objects.
//   - CheckpointStore::Delete: removes a committed checkpoint.
// A write may be spread over several processes (a cluster save: the coordinator begins it, each
// worker joins it): CheckpointWrite::staging_url names the write's staging area,
// CheckpointStore::JoinWrite opens it in another process to Create objects there, and the
// beginning write Adopts each such object before its Commit checks it like one of its own.
// Object names are relative to the checkpoint and are the manifest's own: "data/<name>.
// safetensors" (ValidateDataFileName). A store never sees any other name, so no name from a
// manifest is ever used as a path or key unchecked.
//
// One conformance suite (storage/checkpoint_store_conformance.h) holds every store to these
// promises. Errors name the checkpoint URL and the object.
#ifndef CKPT_STORAGE_CHECKPOINT_STORE_H_
#define CKPT_STORAGE_CHECKPOINT_STORE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "proto/manifest.pb.h"

namespace ckpt {

// Streams the bytes of one object into a CheckpointWrite. Used by one thread at a time.
class ObjectWriter {
 public:
  virtual ~ObjectWriter() = default;
  // Appends `bytes` (they may be buffered until Close).
  virtual absl::Status Append(absl::string_view bytes) = 0;
  // Makes the object durable in the write's staging area (fsync; a completed upload). The
  // object is still invisible to readers until the write commits.
  virtual absl::Status Close(absl::Time deadline) = 0;
};

// One checkpoint being written (CheckpointStore::BeginWrite), or another process's part of one
// (CheckpointStore::JoinWrite: joined()). Objects are created with Create (or, created by a
// joined write elsewhere, taken in with Adopt), then Commit makes them and the manifest visible
// at once. Dropping a write that did not commit aborts it. Create may be called from several
// threads; Adopt, Commit and Abort from one.
class CheckpointWrite {
 public:
  virtual ~CheckpointWrite() = default;

  // The checkpoint's URL, as given to BeginWrite (for a joined write, as its staging URL
  // names it).
  const std::string& url() const { return url_; }

  // A URL naming this write's staging area, which another process passes to
  // CheckpointStore::JoinWrite to add objects to this write (the workers of a cluster save).
  // Store-specific: the file store's is the staging directory's absolute path; s3's is the
  // generation prefix "s3://bucket/prefix/name/<generation>".
  virtual std::string staging_url() const = 0;

  // true for a write returned by JoinWrite.
  bool joined() const { return joined_; }

  // A writer for object `name` ("data/<name>.safetensors"), which must not exist in this write
  // yet. InvalidArgument naming the URL and name for any other name.
  absl::StatusOr<std::unique_ptr<ObjectWriter>> Create(const std::string& name);

  // The commit point. First checks that every data file `manifest` lists was created and
  // closed with exactly its recorded size (FailedPrecondition naming the file otherwise), that
  // nothing else was created, and that the manifest validates; then makes the checkpoint
  // visible. After an error nothing is visible and the write may only be aborted.
  // A joined write cannot commit (FailedPrecondition naming the URL).
  absl::Status Commit(const pb::Manifest& manifest, absl::Time deadline);

  // Makes object `name`, created and closed by a joined write in another process, part of
  // this write, with the size the store holds for it (a stat; a HEAD). NotFound naming the
  // checkpoint URL and the object when the staging area lacks it; InvalidArgument for a name
  // that is not a data file name; AlreadyExists when this write created or adopted it already;
  // FailedPrecondition on a joined write. After Adopt, Commit checks it like an object this
  // write created (an object still being written has not its final size, and fails there).
  absl::Status Adopt(const std::string& name, absl::Time deadline);

  // Removes everything this write stored. OK when there is nothing to remove. The beginning
  // write removes everything in its staging area, joined writes' objects included; a joined
  // write removes only the objects it created itself, never the others'.
  // Dropping a joined write (its normal end: the beginning write adopts what it closed) removes
  // only its objects that did not close; the closed ones are left to the beginning write, whose
  // Commit or Abort ends them.
  absl::Status Abort(absl::Time deadline);

 protected:
  explicit CheckpointWrite(std::string url, bool joined = false)
      : url_(std::move(url)), joined_(joined) {}
  // The store's part of Create, for a valid name not created before in this write.
  virtual absl::StatusOr<std::unique_ptr<ObjectWriter>> CreateObject(const std::string& name) = 0;
  // The store's part of Commit, for a checked manifest: makes the checkpoint visible.
  virtual absl::Status CommitManifest(const pb::Manifest& manifest, absl::Time deadline) = 0;
  // The store's part of Abort.
  virtual absl::Status AbortWrite(absl::Time deadline) = 0;
  // The store's part of Adopt: the size of object `name` in the staging area (NotFound when
  // it is not there).
  virtual absl::StatusOr<int64_t> StagedObjectSize(const std::string& name,
                                                   absl::Time deadline) = 0;
  // A store's ObjectWriter::Close calls this once `name` holds `size` durable bytes.
  void RecordClosed(const std::string& name, int64_t size);
  // The objects this write created that did not close (what dropping a joined write removes).
  std::vector<std::string> UnclosedObjects();

 private:
  // Checks that `name` is a data file name and records it as open in this write:
  // InvalidArgument for another name, AlreadyExists ("was already <already>") when recorded.
  absl::Status Reserve(const std::string& name, absl::string_view already);

  const std::string url_;
  const bool joined_;
  std::mutex mu_;
  // Created objects -> their size once closed (-1 while open).
  std::map<std::string, int64_t> objects_;
};

// A committed checkpoint opened for reading (CheckpointStore::Open). Thread-safe.
class StoredCheckpoint {
 public:
  virtual ~StoredCheckpoint() = default;
  const std::string& url() const { return url_; }
  // The whole manifest, validated (ValidateManifest).
  const pb::Manifest& manifest() const { return manifest_; }
  // Copies bytes [offset, offset + dest.size()) of object `name` into `dest`. NotFound naming
  // the object when it is missing; DataLoss naming it when it holds fewer bytes (or, for a data
  // file, another size than the manifest records); InvalidArgument for a name the manifest does
  // not list as a data file.
  absl::Status Read(const std::string& name, int64_t offset, absl::Span<char> dest,
                    absl::Time deadline) const;

 protected:
  StoredCheckpoint(std::string url, pb::Manifest manifest);
  // The store's part of Read, for a listed data file and a range inside its recorded size.
  virtual absl::Status ReadObject(const std::string& name, int64_t offset, absl::Span<char> dest,
                                  absl::Time deadline) const = 0;

 private:
  const std::string url_;
  const pb::Manifest manifest_;
  absl::flat_hash_map<std::string, int64_t> file_sizes_;  // data file name -> recorded size
};

// What BeginWrite may do at a URL where a checkpoint is already committed.
struct StoreWriteOptions {
  // Replace it (it stays readable, whole, until the new one commits). Without this, an
  // existing checkpoint is AlreadyExists naming the URL.
  bool overwrite = false;
};

// A place checkpoints live (see the file comment). Thread-safe.
class CheckpointStore {
 public:
  virtual ~CheckpointStore() = default;
  // The URL scheme it serves ("file", "s3").
  virtual absl::string_view scheme() const = 0;
  // Starts writing a checkpoint at `url`. AlreadyExists naming the URL when one is committed
  // there and !options.overwrite; InvalidArgument for a URL this store cannot hold.
  virtual absl::StatusOr<std::unique_ptr<CheckpointWrite>> BeginWrite(
      const std::string& url, const StoreWriteOptions& options, absl::Time deadline) = 0;
  // The committed checkpoint at `url`: NotFound naming the URL when none is committed (an
  // uncommitted write is never seen); DataLoss when its manifest does not parse or validate.
  virtual absl::StatusOr<std::unique_ptr<StoredCheckpoint>> Open(const std::string& url,
                                                                 absl::Time deadline) = 0;
  // Removes the committed checkpoint at `url` (NotFound when there is none); a reader that
  // opened it before may then fail with NotFound.
  virtual absl::Status Delete(const std::string& url, absl::Time deadline) = 0;
  // Joins the write whose staging_url() is `staging_url`, begun (BeginWrite) by another
  // process: Create adds objects to its staging area, which become visible when the beginning
  // write commits (after adopting them). A joined write cannot commit (FailedPrecondition
  // naming the URL); aborting or dropping it removes only objects it created (see Abort).
  // InvalidArgument naming the URL when it is not exactly a staging URL of this store (it
  // comes over the network: nothing else is ever written to); NotFound when that write is gone
  // (aborted, committed or never begun).
  virtual absl::StatusOr<std::unique_ptr<CheckpointWrite>> JoinWrite(const std::string& staging_url,
                                                                     absl::Time deadline) = 0;
};

// --- the registry: stores by URL scheme ----------------------------------------------------

// Makes the store of a scheme on first use (e.g. from the environment's credentials).
using CheckpointStoreFactory = std::function<absl::StatusOr<std::unique_ptr<CheckpointStore>>()>;

// Registers the store of `scheme` (a driver's .cc does it at static initialisation through
// CheckpointStoreRegistration; its target is alwayslink). A second registration of a scheme
// replaces the first (tests use that to point a scheme at a test server).
void RegisterCheckpointStore(const std::string& scheme, CheckpointStoreFactory factory);

// The store for `url` (by its scheme, LocationScheme of common/store_url.h: "file" for a plain
// path, "/a/s3://b" too), made once per scheme and kept for the process. InvalidArgument naming
// the URL and the registered schemes when none serves its scheme; the factory's error otherwise.
absl::StatusOr<CheckpointStore*> StoreForUrl(absl::string_view url);

// The registered schemes, sorted.
std::vector<std::string> RegisteredStoreSchemes();

// Registers a store at static initialisation: `static CheckpointStoreRegistration r("s3", f);`
struct CheckpointStoreRegistration {
  CheckpointStoreRegistration(const std::string& scheme, CheckpointStoreFactory factory) {
    RegisterCheckpointStore(scheme, std::move(factory));
  }
};

}  // namespace ckpt

#endif  // CKPT_STORAGE_CHECKPOINT_STORE_H_
