// Which stored pieces each rank's direct load needs, found while a checkpoint's pieces stream
// past once (StreamManifestFile, storage/manifest_file.h), so that neither the coordinator nor
// any worker holds the whole manifest of a large checkpoint (~12 M pieces at 100k ranks). Each
// rank's load part then carries only its pb::ManifestShare. No gRPC, no I/O, no logging.
//
// Reads of the same region of the same tensor (a replicated tensor read by every data-parallel
// replica) are one read group, matched against the pieces once. Pieces are matched through a
// per-tensor index of the groups' spans in the tensor's row-major order, so a piece costs the
// groups whose span it meets, not every group of its tensor.
#ifndef CKPT_COORDINATOR_MANIFEST_SHARE_BUILDER_H_
#define CKPT_COORDINATOR_MANIFEST_SHARE_BUILDER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "proto/manifest.pb.h"
#include "sharding/region.h"

namespace ckpt::coordinator {

// Builds each rank's ManifestShare of one checkpoint: AddRead for every read of every rank,
// then AddPiece for every piece of the manifest in order, then Finish with the manifest's head,
// then ShareOf per rank. Each step once, in that order; none after an error.
class ManifestShareBuilder {
 public:
  explicit ManifestShareBuilder(int num_ranks);

  // Rank `rank` reads `region` (valid for `global_shape`) of tensor `key`.
  void AddRead(int rank, absl::string_view key, absl::Span<const int64_t> global_shape,
               const Region& region);
  // Records `piece` for every read it overlaps (pieces of tensors nobody reads are skipped).
  // InvalidArgument for a piece whose region does not fit the shape its readers gave (the
  // caller then reports the shape mismatch itself).
  absl::Status AddPiece(const pb::StoredPiece& piece);
  // Resolves tensors and files against `head` (the manifest without pieces) and checks that
  // every read is covered exactly by the pieces it met: DataLoss naming the checkpoint
  // `path`, tensor, region and a reading rank otherwise (a validated manifest tiles each tensor,
  // so this guards the matching itself).
  absl::Status Finish(const pb::Manifest& head, absl::string_view path);
  // The serialized pb::ManifestShare of `rank`: the pieces its reads overlap (each once, in
  // manifest order), their tensors and files, and the head's object_generation.
  std::string ShareOf(int rank) const;
  // The serialized pb::ManifestShare of an exchange-load part (ids are those AddPiece kept,
  // numbered from 0 in manifest order: pieces_kept() before the piece was kept): the kept
  // pieces `read` in full, then `unread` as unread_pieces (tensor id and region only), in the
  // orders given (they number the pieces for the part's units); the tensors of those pieces and
  // of `keys` (the part's requests; a key no rank reads is skipped); the files of `read`.
  // Ids out of range are the caller's error (checked: they are skipped).
  std::string ShareOfPieces(absl::Span<const int32_t> read, absl::Span<const int32_t> unread,
                            absl::Span<const std::string> keys) const;

  // Pieces recorded for at least one read.
  int64_t pieces_kept() const { return static_cast<int64_t>(piece_offsets_.size()); }

 private:
  // Reads of one region of one tensor, by one or more ranks.
  struct ReadGroup {
    Region region;
    int tensor = 0;     // index in tensors_
    int64_t first = 0;  // span of the region's elements in the tensor's row-major order
    int64_t last = -1;
    int64_t elements = 0;
    int64_t covered = 0;          // elements of the pieces met (overlaps summed)
    int first_rank = 0;           // a rank that reads it, for errors
    std::vector<int32_t> pieces;  // ids of the kept pieces it overlaps, in manifest order
  };
  // The read groups of one tensor, and their spans indexed once the pieces start.
  struct TensorReads {
    std::string key;
    std::vector<int64_t> shape;
    std::vector<int> groups;
    absl::flat_hash_map<std::vector<int64_t>, int> group_of_region;
    bool indexed = false;
    std::vector<int64_t> max_last;  // prefix maximum of `last` over `groups` sorted by `first`
  };

  void IndexSpans(TensorReads& tensor);
  // Kept piece `id`'s record (tag, length, SharedPiece) in `records` at `offsets`.
  static absl::string_view Record(const std::string& records, const std::vector<int64_t>& offsets,
                                  int32_t id);
  // A share of kept pieces `read` (whole records) and `unread` (tensor and region) with the
  // tensors `tensors` (besides those of the pieces); `read` and `unread` in the order given.
  std::string Assemble(absl::Span<const int32_t> read, absl::Span<const int32_t> unread,
                       std::vector<int> tensors) const;
  int KeepPiece(int tensor, const pb::StoredPiece& piece);
  int FileId(const std::string& name);

  std::vector<std::vector<int>> groups_of_rank_;
  std::vector<ReadGroup> groups_;
  std::vector<TensorReads> tensors_;
  absl::flat_hash_map<std::string, int> tensor_of_key_;
  // Kept pieces as serialized ManifestShare.pieces records, back to back.
  std::string piece_records_;
  std::vector<int64_t> piece_offsets_;
  // The same pieces as ManifestShare.unread_pieces records (tensor id and region), back to back.
  std::string unread_records_;
  std::vector<int64_t> unread_offsets_;
  std::vector<int32_t> piece_file_;    // by kept piece: its file id
  std::vector<int32_t> piece_tensor_;  // by kept piece: its tensor id
  std::vector<std::string> file_names_;
  absl::flat_hash_map<std::string, int> file_of_name_;
  // Set by Finish: by tensor and file id, the head's metadata.
  std::vector<pb::TensorMeta> tensor_meta_;
  std::vector<pb::DataFile> file_meta_;
  uint32_t format_version_ = 0;
  int64_t checksum_block_bytes_ = 0;
  std::string object_generation_;  // the head's (a checkpoint in an object store)
};

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_MANIFEST_SHARE_BUILDER_H_
