#include "tools/loadgen/sparse_save.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <map>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "proto/convert.h"
#include "proto/manifest.pb.h"
#include "storage/checksum.h"
#include "storage/file_util.h"
#include "storage/manifest_codec.h"
#include "storage/safetensors.h"

namespace ckpt::loadgen {
namespace {

// Data sections start at this alignment, as storage's checkpoint writer aligns them.
constexpr int64_t kDataAlignment = 4096;

// The manifest checksum fields of a piece of `n` zero bytes, as the checkpoint writer records
// them: one XXH3 when it fits in one block, else the block hashes and their combination.
void SetZeroChecksums(int64_t n, pb::StoredPiece* piece) {
  const int64_t block = kDefaultChecksumBlockBytes;
  if (n <= block) {
    piece->set_xxh3_64(ZeroBytesHash(n));
    return;
  }
  std::vector<uint64_t> blocks(n / block, ZeroBytesHash(block));
  if (n % block != 0) blocks.push_back(ZeroBytesHash(n % block));
  for (uint64_t b : blocks) piece->add_block_xxh3(b);
  piece->set_xxh3_64(CombineBlockHashes(blocks));
}

// Writes `header` at the front of a new file of `size` bytes (the rest a hole).
absl::Status WriteHeaderAndHole(const std::string& path, const std::string& header, int64_t size,
                                bool fsync) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("create ", path));
  absl::Status s;
  size_t done = 0;
  while (s.ok() && done < header.size()) {
    const ssize_t n = ::pwrite(fd, header.data() + done, header.size() - done, done);
    if (n < 0 && errno != EINTR) s = ErrnoStatus(errno, absl::StrCat("write ", path));
    if (n > 0) done += n;
  }
  if (s.ok() && ::ftruncate(fd, size) != 0) {
    s = ErrnoStatus(errno, absl::StrCat("extend ", path));
  }
  if (s.ok() && fsync) s = FsyncFd(fd, path);
  ::close(fd);
  return s;
}

}  // namespace

uint64_t ZeroBytesHash(int64_t n) {
  static std::mutex mu;
  static std::map<int64_t, uint64_t>* cache = new std::map<int64_t, uint64_t>();
  static const std::vector<char>* zeros = new std::vector<char>(kDefaultChecksumBlockBytes, 0);
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache->find(n);
  if (it != cache->end()) return it->second;
  const uint64_t h = Xxh3(zeros->data(), static_cast<size_t>(n));
  (*cache)[n] = h;
  return h;
}

namespace {

// A planned piece with its key, dtype and region: given in the plan, or the rank's own piece
// at its local index (pb::PlanPiece).
struct ResolvedPiece {
  std::string key;
  DType dtype = DType::kF32;
  Region region;
  int64_t size_bytes = 0;
};

absl::StatusOr<ResolvedPiece> Resolve(const pb::PlanPiece& p,
                                      const google::protobuf::RepeatedPtrField<pb::PieceMeta>& own,
                                      const std::string& who, const std::string& file) {
  const bool given = !p.key().empty();
  if (!given && (p.local_index() < 0 || p.local_index() >= static_cast<int>(own.size()))) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": piece at local index ", p.local_index(),
                                                   " of ", file, " is not among ", own.size(),
                                                   " pieces"));
  }
  const pb::PieceMeta* mine = given ? nullptr : &own[p.local_index()];
  absl::StatusOr<DType> dtype = DTypeFromProto(given ? p.dtype() : mine->tensor().dtype());
  absl::StatusOr<Region> region = RegionFromProto(given ? p.region() : mine->region());
  ResolvedPiece out;
  out.key = given ? p.key() : mine->tensor().key();
  if (!dtype.ok() || !region.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": piece ", out.key, " of ", file, " has an invalid dtype/region"));
  }
  out.dtype = *dtype;
  out.region = *std::move(region);
  out.size_bytes = p.size_bytes();
  if (!given && out.region.NumElements() * DTypeSize(out.dtype) != out.size_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": piece ", out.key, " of ", file, " has ", out.size_bytes,
        " bytes planned, not its own ", out.region.NumElements() * DTypeSize(out.dtype)));
  }
  return out;
}

}  // namespace

absl::StatusOr<std::string> WriteSparseSavePart(
    const pb::SavePlanPart& part, const google::protobuf::RepeatedPtrField<pb::PieceMeta>& own,
    bool fsync) {
  const std::string who = absl::StrCat("rank ", part.rank());
  pb::Manifest written;
  for (int i = 0; i < part.files_size(); ++i) {
    const pb::PlanFile& file = part.files(i);
    const std::string name = DataFileName(part.rank(), i);
    if (file.path() != name) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, ": planned file ", file.path(), " is not the worker's name ", name));
    }
    std::vector<SafetensorsEntry> entries;
    std::vector<ResolvedPiece> pieces;
    int64_t pos = 0;
    for (const pb::PlanPiece& p : file.pieces()) {
      absl::StatusOr<ResolvedPiece> piece = Resolve(p, own, who, name);
      if (!piece.ok()) return piece.status();
      entries.push_back({EncodeEntryName(piece->key, piece->region), piece->dtype,
                         EntryShape(piece->region), pos, pos + piece->size_bytes});
      pos += piece->size_bytes;
      pieces.push_back(*std::move(piece));
    }
    absl::StatusOr<std::string> header =
        EncodeSafetensorsHeader(entries,
                                {{"format", "ckpt"},
                                 {"writer_rank", absl::StrCat(part.rank())},
                                 {"ckpt_writer", kWriterVersion}},
                                kDataAlignment);
    if (!header.ok()) {
      return absl::Status(header.status().code(),
                          absl::StrCat(who, ": ", name, ": ", header.status().message()));
    }
    const int64_t data_start = static_cast<int64_t>(header->size());
    absl::Status s =
        WriteHeaderAndHole(JoinPath(part.staging_dir(), name), *header, data_start + pos, fsync);
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat(who, ": ", s.message()));
    pb::DataFile* df = written.add_files();
    df->set_name(name);
    df->set_writer_rank(part.rank());
    df->set_data_start(data_start);
    df->set_size_bytes(data_start + pos);
    for (size_t j = 0; j < pieces.size(); ++j) {
      const ResolvedPiece& p = pieces[j];
      pb::StoredPiece* sp = written.add_pieces();
      sp->set_key(p.key);
      *sp->mutable_region() = RegionToProto(p.region);
      sp->set_file(name);
      sp->set_entry_name(entries[j].name);
      sp->set_byte_offset(data_start + entries[j].begin);
      sp->set_byte_length(p.size_bytes);
      sp->set_writer_rank(part.rank());
      SetZeroChecksums(p.size_bytes, sp);
    }
  }
  return written.SerializeAsString();
}

}  // namespace ckpt::loadgen
