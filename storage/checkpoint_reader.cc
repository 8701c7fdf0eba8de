#include "storage/checkpoint_reader.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "sharding/coverage.h"
#include "sharding/dtype.h"
#include "sharding/overlap.h"
#include "storage/file_util.h"
#include "storage/manifest_codec.h"
#include "storage/manifest_file.h"
#include "storage/piece_codec.h"
#include "storage/safetensors.h"
#include "storage/store_objects.h"

namespace ckpt {
namespace {

constexpr char kManifestName[] = "manifest.pb";

// Where the pieces' bytes are: files under `dir`, or the objects of `objects` when it is set
// (read before `deadline`).
struct PieceSource {
  const std::string& dir;
  const StoreObjects* objects = nullptr;
  absl::Time deadline = absl::InfiniteFuture();
  // The file or object that data file `name` is, for errors.
  std::string Where(const std::string& name) const {
    return objects != nullptr ? objects->Describe(name) : JoinPath(dir, name);
  }
};

// ReadDataFileHeader for data object `file` of `objects`: its size (a HEAD), then its header
// (two ranged GETs). Errors name the object.
absl::StatusOr<SafetensorsHeader> ReadObjectHeader(const StoreObjects& objects,
                                                   const pb::DataFile& file, absl::Time deadline) {
  const std::string where = objects.Describe(file.name());
  CKPT_ASSIGN_OR_RETURN(int64_t size, objects.Size(file.name(), deadline));
  if (size != file.size_bytes()) {
    return absl::DataLossError(absl::StrCat("data object ", where, " is ", size,
                                            " bytes; the manifest says ", file.size_bytes(),
                                            size < file.size_bytes() ? " (truncated)" : ""));
  }
  std::string prefix(static_cast<size_t>(std::min<int64_t>(8, size)), '\0');
  CKPT_RETURN_IF_ERROR(objects.Read(file.name(), 0, absl::MakeSpan(prefix), deadline));
  CKPT_ASSIGN_OR_RETURN(uint64_t header_len, ParseSafetensorsPrefix(prefix, size, where));
  std::string json(static_cast<size_t>(header_len), '\0');
  CKPT_RETURN_IF_ERROR(objects.Read(file.name(), 8, absl::MakeSpan(json), deadline));
  return ParseSafetensorsHeader(json, size, where);
}

// Checks data file `file` of `source` against the manifest `index` covers (a share's when
// `share`: only its pieces' entries).
absl::Status CheckDataFile(const PieceSource& source, const ManifestIndex& index,
                           const pb::DataFile& file, bool share) {
  CKPT_ASSIGN_OR_RETURN(const SafetensorsHeader header,
                        source.objects != nullptr
                            ? ReadObjectHeader(*source.objects, file, source.deadline)
                            : ReadDataFileHeader(source.dir, file));
  return share ? CheckHeaderAgainstShare(index, file, header)
               : CheckHeaderAgainstManifest(index, file, header);
}

// CheckDataFile for every data file of `manifest`: one after another for a directory; for
// objects, whose checks are round trips (a HEAD and two GETs each), on up to io.num_threads *
// io.queue_depth threads. The error of the first failing file in manifest order wins.
absl::Status CheckDataFiles(const PieceSource& source, const ManifestIndex& index,
                            const pb::Manifest& manifest, bool share, const IoOptions& io) {
  if (source.objects == nullptr) {
    for (const pb::DataFile& f : manifest.files()) {
      CKPT_RETURN_IF_ERROR(CheckDataFile(source, index, f, share));
    }
    return absl::OkStatus();
  }
  const size_t n = static_cast<size_t>(manifest.files_size());
  std::vector<absl::Status> checked(n);
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < n;) {
      checked[i] = CheckDataFile(source, index, manifest.files(static_cast<int>(i)), share);
    }
  };
  const size_t threads =
      std::min(n, static_cast<size_t>(std::max(1, io.num_threads) * std::max(1, io.queue_depth)));
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  for (const absl::Status& s : checked) CKPT_RETURN_IF_ERROR(s);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SafetensorsHeader> ReadDataFileHeader(const std::string& dir,
                                                     const pb::DataFile& file) {
  const std::string path = JoinPath(dir, file.name());
  CKPT_ASSIGN_OR_RETURN(int64_t size, FileSize(path));
  if (size != file.size_bytes()) {
    return absl::DataLossError(absl::StrCat("data file ", path, " is ", size,
                                            " bytes; the manifest says ", file.size_bytes(),
                                            size < file.size_bytes() ? " (truncated)" : ""));
  }
  CKPT_ASSIGN_OR_RETURN(std::string prefix, ReadFileRange(path, 0, 8));
  CKPT_ASSIGN_OR_RETURN(uint64_t header_len, ParseSafetensorsPrefix(prefix, size, path));
  CKPT_ASSIGN_OR_RETURN(std::string json, ReadFileRange(path, 8, static_cast<int64_t>(header_len)));
  return ParseSafetensorsHeader(json, size, path);
}

absl::Status CheckCheckpointComplete(const std::string& path) {
  switch (ProbeCheckpoint(path).state) {
    case CheckpointState::kMissing:
      return absl::NotFoundError(absl::StrCat("no checkpoint at ", path));
    case CheckpointState::kNotADirectory:
      return absl::FailedPreconditionError(absl::StrCat(path, " is not a checkpoint directory"));
    case CheckpointState::kIncomplete:
      return absl::FailedPreconditionError(absl::StrCat(
          "incomplete checkpoint at ", path, " (no manifest.pb: its write never committed)"));
    case CheckpointState::kComplete:
      break;
  }
  return absl::OkStatus();
}

absl::StatusOr<pb::Manifest> StreamCheckpointManifest(const std::string& path,
                                                      ManifestPieceVisitor visit,
                                                      absl::Time deadline) {
  if (!IsObjectStoreLocation(path)) {
    CKPT_RETURN_IF_ERROR(CheckCheckpointComplete(path));
    return StreamManifestFile(path, visit);
  }
  CKPT_ASSIGN_OR_RETURN(pb::Manifest manifest, ReadStoreManifest(path, deadline));
  for (int i = 0; i < manifest.pieces_size(); ++i) {
    CKPT_RETURN_IF_ERROR(visit(i, *manifest.mutable_pieces(i)));
  }
  manifest.clear_pieces();
  return manifest;
}

absl::Status CheckDataFileSizes(const std::string& path, const pb::Manifest& head,
                                absl::Time deadline) {
  if (IsObjectStoreLocation(path)) {
    CKPT_ASSIGN_OR_RETURN(std::unique_ptr<StoreObjects> objects, StoreObjects::Open(path, head));
    return CheckObjectSizes(*objects, head, deadline);
  }
  for (const pb::DataFile& f : head.files()) {
    const std::string file = JoinPath(path, f.name());
    CKPT_ASSIGN_OR_RETURN(int64_t size, FileSize(file));
    if (size != f.size_bytes()) {
      return absl::DataLossError(absl::StrCat("data file ", file, " is ", size,
                                              " bytes; the manifest says ", f.size_bytes(),
                                              size < f.size_bytes() ? " (truncated)" : ""));
    }
  }
  return absl::OkStatus();
}

const char* CheckpointStateName(CheckpointState state) {
  switch (state) {
    case CheckpointState::kMissing:
      return "missing";
    case CheckpointState::kIncomplete:
      return "incomplete";
    case CheckpointState::kComplete:
      return "complete";
    case CheckpointState::kNotADirectory:
      return "not a directory";
  }
  return "?";
}

CheckpointProbe ProbeCheckpoint(const std::string& path) {
  CheckpointProbe probe;
  if (!PathExists(path)) {
    probe.state = CheckpointState::kMissing;
  } else if (!IsDirectory(path)) {
    probe.state = CheckpointState::kNotADirectory;
  } else {
    probe.state = PathExists(JoinPath(path, kManifestName)) ? CheckpointState::kComplete
                                                            : CheckpointState::kIncomplete;
  }
  const std::string parent = ParentDir(path);
  auto names = ListDir(parent);
  if (names.ok()) {
    const std::string prefix = absl::StrCat(".", BaseName(path), ".");
    for (const std::string& n : *names) {
      if (!absl::StartsWith(n, prefix)) continue;
      absl::string_view rest = absl::string_view(n).substr(prefix.size());
      if (!absl::StartsWith(rest, "tmp-") && !absl::StartsWith(rest, "old-")) continue;
      const std::string full = JoinPath(parent, n);
      const bool has_manifest = PathExists(JoinPath(full, kManifestName));
      probe.leftovers.push_back(absl::StrCat(
          full, absl::StartsWith(rest, "old-")
                    ? " (previous checkpoint moved aside by an interrupted overwrite)"
                    : (has_manifest ? " (complete but not under the final name: an interrupted "
                                      "commit, or the checkpoint an interrupted overwrite replaced)"
                                    : " (interrupted write, incomplete)")));
    }
  }
  return probe;
}

absl::StatusOr<std::unique_ptr<CheckpointReader>> CheckpointReader::Open(
    const std::string& path, const ReaderOptions& options) {
  if (IsObjectStoreLocation(path)) {
    CKPT_ASSIGN_OR_RETURN(pb::Manifest manifest,
                          ReadStoreManifest(path, absl::Now() + options.store_timeout));
    return FromManifest(path, std::move(manifest), options, /*share=*/false);
  }
  CKPT_RETURN_IF_ERROR(CheckCheckpointComplete(path));
  CKPT_ASSIGN_OR_RETURN(pb::Manifest manifest, ReadManifestFile(path));
  return FromManifest(path, std::move(manifest), options, /*share=*/false);
}

absl::StatusOr<std::unique_ptr<CheckpointReader>> CheckpointReader::OpenShare(
    const std::string& path, pb::Manifest share, const ReaderOptions& options) {
  if (!IsObjectStoreLocation(path)) CKPT_RETURN_IF_ERROR(CheckCheckpointComplete(path));
  if (absl::Status s = ValidateManifestShare(share); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("manifest share of ", path, ": ", s.message()));
  }
  return FromManifest(path, std::move(share), options, /*share=*/true);
}

absl::StatusOr<std::unique_ptr<CheckpointReader>> CheckpointReader::FromManifest(
    const std::string& path, pb::Manifest manifest, const ReaderOptions& options, bool share) {
  std::unique_ptr<CheckpointReader> r(new CheckpointReader());
  r->path_ = path;
  r->options_ = options;
  r->manifest_ = std::move(manifest);
  PieceSource source{path};
  if (IsObjectStoreLocation(path)) {
    CKPT_ASSIGN_OR_RETURN(r->objects_, StoreObjects::Open(path, r->manifest_));
    // The objects hold the generation now; the manifest handed on has none, as a store's
    // (a copy written elsewhere never names another store's objects).
    r->manifest_.clear_object_generation();
    source.objects = r->objects_.get();
    source.deadline = absl::Now() + options.store_timeout;
  }
  const ManifestIndex index(r->manifest_);
  CKPT_RETURN_IF_ERROR(CheckDataFiles(source, index, r->manifest_, share, options.io));
  r->IndexPieces(index);
  return r;
}

void CheckpointReader::IndexPieces(const ManifestIndex& index) {
  const int num_tensors = manifest_.tensors_size();
  tensor_index_.reserve(num_tensors);
  for (int i = 0; i < num_tensors; ++i) tensor_index_[manifest_.tensors(i).key()] = i;
  // A counting sort of the pieces by tensor, keeping manifest order within each tensor.
  piece_start_.assign(num_tensors + 1, 0);
  for (int i = 0; i < manifest_.pieces_size(); ++i) ++piece_start_[index.TensorOfPiece(i) + 1];
  for (int t = 0; t < num_tensors; ++t) piece_start_[t + 1] += piece_start_[t];
  pieces_by_tensor_.resize(manifest_.pieces_size());
  std::vector<int> next(piece_start_.begin(), piece_start_.end() - 1);
  for (int i = 0; i < manifest_.pieces_size(); ++i) {
    pieces_by_tensor_[next[index.TensorOfPiece(i)]++] = i;
  }
}

const pb::TensorMeta* CheckpointReader::FindTensor(const std::string& key) const {
  auto it = tensor_index_.find(key);
  return it == tensor_index_.end() ? nullptr : &manifest_.tensors(it->second);
}

std::vector<int> CheckpointReader::PiecesOf(const std::string& key) const {
  auto it = tensor_index_.find(key);
  if (it == tensor_index_.end()) return {};
  return std::vector<int>(pieces_by_tensor_.begin() + piece_start_[it->second],
                          pieces_by_tensor_.begin() + piece_start_[it->second + 1]);
}

absl::Status CheckpointReader::ReadPieces(const std::vector<PieceRead>& reads) const {
  return ReadPieces(reads, options_.verify_checksums);
}

namespace {

// ReadStoredPieces for uncompressed pieces (or views of compressed pieces' stored bytes).
absl::Status ReadPlainPieces(const PieceSource& source, int64_t checksum_block_bytes,
                             absl::Span<const StoredPieceRead> reads, bool verify,
                             const IoOptions& io) {
  // Partial reads that do not line up with checksum blocks go through a staging buffer that
  // covers whole blocks, then the requested bytes are copied out.
  struct Staged {
    std::unique_ptr<char[]> buf;
    int64_t skip = 0;
    int64_t n = 0;
    void* dest = nullptr;
  };
  std::vector<Staged> staged;
  std::vector<RangeRead> ranges;
  const int64_t block = checksum_block_bytes;
  for (const StoredPieceRead& pr : reads) {
    const pb::StoredPiece& p = *pr.piece;
    const int64_t len = p.byte_length();
    if (pr.begin < 0 || pr.begin > pr.end || pr.end > len) {
      return absl::InvalidArgumentError(absl::StrCat("byte range [", pr.begin, ", ", pr.end,
                                                     ") is outside ", DescribePiece(p), " of ", len,
                                                     " bytes"));
    }
    RangeRead rr;
    rr.path = source.objects != nullptr ? p.file() : JoinPath(source.dir, p.file());
    // The entry name says the key and region (formatting DescribePiece per read would cost
    // more than a small read).
    rr.label = absl::StrCat("tensor \"", p.key(), "\", entry \"", p.entry_name(), "\"");
    int64_t b = pr.begin, e = pr.end;
    if (!verify) {
      if (b == e) continue;
      rr.offset = p.byte_offset() + b;
      rr.length = e - b;
      rr.dest = pr.dest;
      ranges.push_back(std::move(rr));
      continue;
    }
    rr.verify = true;
    if (p.block_xxh3_size() > 0) {
      if (b == e) continue;
      b = b / block * block;
      e = std::min((e + block - 1) / block * block, len);
      rr.block_bytes = block;
      rr.expected.assign(p.block_xxh3().begin() + b / block,
                         p.block_xxh3().begin() + (e + block - 1) / block);
    } else {
      b = 0;
      e = len;
      rr.expected = {p.xxh3_64()};
    }
    rr.offset = p.byte_offset() + b;
    rr.length = e - b;
    if (b == pr.begin && e == pr.end) {
      rr.dest = pr.dest;
    } else {
      Staged s;
      s.buf.reset(new char[std::max<int64_t>(1, e - b)]);
      s.skip = pr.begin - b;
      s.n = pr.end - pr.begin;
      s.dest = pr.dest;
      rr.dest = s.buf.get();
      staged.push_back(std::move(s));
    }
    ranges.push_back(std::move(rr));
  }
  CKPT_RETURN_IF_ERROR(source.objects != nullptr
                           ? ReadObjectRanges(*source.objects, ranges, io, source.deadline)
                           : ReadRanges(ranges, io));
  for (const Staged& s : staged) {
    if (s.n > 0) std::memcpy(s.dest, s.buf.get() + s.skip, s.n);
  }
  return absl::OkStatus();
}

// A compressed piece being read: its frame's stored bytes of [stored_begin, stored_end), read
// into `stored`, and the index once parsed.
struct PackedRead {
  const StoredPieceRead* read = nullptr;
  pb::StoredPiece view;  // the piece's stored bytes seen as an uncompressed piece
  std::string what;      // names the file and piece in errors
  FrameExpect expect;
  FrameIndex index;
  int64_t stored_begin = 0;
  int64_t stored_end = 0;
  std::unique_ptr<char[]> stored;
};

// Reads [begin, end) of each packed read's stored bytes (set in the reads) into `stored`.
absl::Status ReadStoredSpans(const PieceSource& source, int64_t block,
                             std::vector<PackedRead>& packed, bool verify, const IoOptions& io) {
  std::vector<StoredPieceRead> spans;
  for (PackedRead& r : packed) {
    r.stored.reset(new char[std::max<int64_t>(1, r.stored_end - r.stored_begin)]);
    spans.push_back({&r.view, r.stored_begin, r.stored_end, r.stored.get()});
  }
  return ReadPlainPieces(source, block, spans, verify, io);
}

// Parses each packed read's index from the start of its `stored` bytes and checks it against
// the manifest: the frame (ParseFrameIndex) and, with `verify`, the raw checksum.
absl::Status ParseIndexes(std::vector<PackedRead>& packed, bool verify) {
  for (PackedRead& r : packed) {
    CKPT_ASSIGN_OR_RETURN(
        r.index, ParseFrameIndex(absl::string_view(r.stored.get(), r.stored_end - r.stored_begin),
                                 r.expect, r.what));
    if (verify && r.index.RawChecksum() != r.read->piece->raw_xxh3_64()) {
      return absl::DataLossError(absl::StrCat("compressed ", r.what,
                                              ": the frame's raw checksums do not match the "
                                              "manifest's raw XXH3-64"));
    }
  }
  return absl::OkStatus();
}

// One chunk to decode: into `dest` when it lies wholly inside the read, else through a buffer
// from which [skip, skip + n) goes to `dest`.
struct ChunkJob {
  const PackedRead* read = nullptr;
  int chunk = 0;
  int64_t skip = 0;
  int64_t n = 0;
  char* dest = nullptr;
};

// Decodes the chunks on up to `threads` threads; the first error wins.
absl::Status DecodeChunks(const std::vector<ChunkJob>& jobs, int threads, bool verify) {
  std::atomic<size_t> next{0};
  std::mutex mu;
  absl::Status first;
  auto work = [&] {
    CodecScratch scratch;
    std::string buf;
    for (size_t j; (j = next.fetch_add(1)) < jobs.size();) {
      const ChunkJob& job = jobs[j];
      const PackedRead& r = *job.read;
      const FrameChunk& c = r.index.chunks[job.chunk];
      const bool whole = job.skip == 0 && job.n == c.raw_bytes;
      if (!whole && static_cast<int64_t>(buf.size()) < c.raw_bytes) buf.resize(c.raw_bytes);
      char* out = whole ? job.dest : buf.data();
      absl::Status s = DecodeChunk(
          r.index, job.chunk,
          absl::string_view(r.stored.get() + (c.stored_offset - r.stored_begin), c.stored_bytes),
          out, verify, scratch, r.what);
      if (s.ok() && !whole) std::memcpy(job.dest, buf.data() + job.skip, job.n);
      if (!s.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        if (first.ok()) first = s;
        next = jobs.size();
      }
    }
  };
  const int n = static_cast<int>(std::min<size_t>(std::max(1, threads), jobs.size()));
  std::vector<std::thread> pool;
  for (int t = 1; t < n; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  return first;
}

// The chunks of each packed read that overlap its raw range, as decode jobs.
std::vector<ChunkJob> ChunkJobs(const std::vector<PackedRead>& packed) {
  std::vector<ChunkJob> jobs;
  for (const PackedRead& r : packed) {
    const int64_t begin = r.read->begin, end = r.read->end;
    for (const FrameChunk& c : r.index.chunks) {
      const int64_t lo = std::max(begin, c.raw_offset);
      const int64_t hi = std::min(end, c.raw_offset + c.raw_bytes);
      if (lo >= hi) continue;
      jobs.push_back({&r, static_cast<int>(&c - r.index.chunks.data()), lo - c.raw_offset, hi - lo,
                      static_cast<char*>(r.read->dest) + (lo - begin)});
    }
  }
  return jobs;
}

// ReadStoredPieces for compressed pieces: a whole-piece read takes the whole frame in one read;
// a partial one reads the frame's index first, then only the chunks it needs. Every size is
// checked against the manifest before anything is allocated (the validator bounds the stored
// length by the file, and the frame by the stored length).
absl::Status ReadPackedPieces(const PieceSource& source, int64_t block,
                              absl::Span<const StoredPieceRead* const> reads, bool verify,
                              const IoOptions& io) {
  std::vector<PackedRead> whole, partial;
  for (const StoredPieceRead* pr : reads) {
    const pb::StoredPiece& p = *pr->piece;
    PackedRead r;
    r.read = pr;
    r.view = p;
    r.view.set_byte_length(p.stored_length());
    r.view.set_codec(0);
    r.what = absl::StrCat(source.Where(p.file()), ", tensor \"", p.key(), "\", entry \"",
                          p.entry_name(), "\"");
    CKPT_ASSIGN_OR_RETURN(r.expect.codec, PieceCodecFromInt(p.codec()));
    r.expect.raw_bytes = p.byte_length();
    r.expect.stored_bytes = p.stored_length();
    r.expect.chunk_bytes = p.codec_chunk_bytes();
    const int64_t index_bytes =
        FrameIndexBytes(p.byte_length(), std::max<int64_t>(1, p.codec_chunk_bytes()));
    if (p.codec_chunk_bytes() < 1 || index_bytes > p.stored_length()) {
      return absl::DataLossError(absl::StrCat("compressed ", r.what, ": stored length ",
                                              p.stored_length(), " cannot hold its index"));
    }
    const bool all = pr->begin == 0 && pr->end == p.byte_length();
    r.stored_end = all ? p.stored_length() : index_bytes;
    (all ? whole : partial).push_back(std::move(r));
  }
  CKPT_RETURN_IF_ERROR(ReadStoredSpans(source, block, partial, verify, io));
  CKPT_RETURN_IF_ERROR(ParseIndexes(partial, verify));
  for (PackedRead& r : partial) {  // now only the chunks the range needs
    const int64_t chunk = r.index.chunk_bytes;
    const FrameChunk& first = r.index.chunks[r.read->begin / chunk];
    const FrameChunk& last = r.index.chunks[(r.read->end - 1) / chunk];
    r.stored_begin = first.stored_offset;
    r.stored_end = last.stored_offset + last.stored_bytes;
  }
  CKPT_RETURN_IF_ERROR(ReadStoredSpans(source, block, whole, verify, io));
  CKPT_RETURN_IF_ERROR(ParseIndexes(whole, verify));
  CKPT_RETURN_IF_ERROR(ReadStoredSpans(source, block, partial, verify, io));
  std::vector<ChunkJob> jobs = ChunkJobs(whole);
  std::vector<ChunkJob> more = ChunkJobs(partial);
  jobs.insert(jobs.end(), more.begin(), more.end());
  return DecodeChunks(jobs, io.num_threads, verify);
}

// ReadStoredPieces from `source`.
absl::Status ReadStoredPiecesFrom(const PieceSource& source, int64_t checksum_block_bytes,
                                  absl::Span<const StoredPieceRead> reads, bool verify,
                                  const IoOptions& io) {
  std::vector<StoredPieceRead> plain;
  std::vector<const StoredPieceRead*> packed;
  for (const StoredPieceRead& pr : reads) {
    const pb::StoredPiece& p = *pr.piece;
    if (p.codec() == 0) {
      plain.push_back(pr);
      continue;
    }
    if (pr.begin < 0 || pr.begin > pr.end || pr.end > p.byte_length()) {
      return absl::InvalidArgumentError(absl::StrCat("byte range [", pr.begin, ", ", pr.end,
                                                     ") is outside ", DescribePiece(p), " of ",
                                                     p.byte_length(), " bytes"));
    }
    if (pr.begin < pr.end) packed.push_back(&pr);
  }
  if (!plain.empty()) {
    CKPT_RETURN_IF_ERROR(ReadPlainPieces(source, checksum_block_bytes, plain, verify, io));
  }
  if (packed.empty()) return absl::OkStatus();
  return ReadPackedPieces(source, checksum_block_bytes, packed, verify, io);
}

}  // namespace

absl::Status ReadStoredPieces(const std::string& dir, int64_t checksum_block_bytes,
                              absl::Span<const StoredPieceRead> reads, bool verify,
                              const IoOptions& io) {
  return ReadStoredPiecesFrom(PieceSource{dir}, checksum_block_bytes, reads, verify, io);
}

absl::Status ReadStoredPieces(const StoreObjects& objects, int64_t checksum_block_bytes,
                              absl::Span<const StoredPieceRead> reads, bool verify,
                              const IoOptions& io, absl::Time deadline) {
  return ReadStoredPiecesFrom(PieceSource{objects.url(), &objects, deadline}, checksum_block_bytes,
                              reads, verify, io);
}

absl::Status CheckpointReader::ReadPieces(const std::vector<PieceRead>& reads, bool verify) const {
  std::vector<StoredPieceRead> stored;
  stored.reserve(reads.size());
  for (const PieceRead& pr : reads) {
    if (pr.piece < 0 || pr.piece >= manifest_.pieces_size()) {
      return absl::InvalidArgumentError(absl::StrCat("no stored piece ", pr.piece));
    }
    stored.push_back({&manifest_.pieces(pr.piece), pr.begin, pr.end, pr.dest});
  }
  if (objects_ != nullptr) {
    return ReadStoredPieces(*objects_, manifest_.checksum_block_bytes(), stored, verify,
                            options_.io, absl::Now() + options_.store_timeout);
  }
  return ReadStoredPieces(path_, manifest_.checksum_block_bytes(), stored, verify, options_.io);
}

absl::Status CheckpointReader::ReadRegion(const std::string& key, const Region& region,
                                          void* dest) const {
  return ReadRegions({RegionRead{key, region, dest}});
}

absl::Status CheckpointReader::ReadRegions(absl::Span<const RegionRead> regions) const {
  // A part of a stored piece that lands in its destination in several runs: read into `buf`,
  // then copied out.
  struct Part {
    std::vector<CopyRun> runs;
    std::unique_ptr<char[]> buf;
    int64_t elem_size = 0;
    void* dest = nullptr;
  };
  std::vector<Part> parts;
  std::vector<PieceRead> reads;
  for (const RegionRead& rr : regions) {
    const pb::TensorMeta* t = FindTensor(rr.key);
    if (t == nullptr) {
      return absl::NotFoundError(absl::StrCat("no tensor \"", rr.key, "\" in ", path_));
    }
    CKPT_ASSIGN_OR_RETURN(DType dtype, DTypeFromProto(t->dtype()));
    const int64_t es = DTypeSize(dtype);
    const std::vector<int64_t> shape(t->global_shape().begin(), t->global_shape().end());
    absl::Status valid = ValidateRegion(rr.region, shape);
    if (!valid.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor \"", rr.key, "\" region ", rr.region.DebugString(), ": ", valid.message()));
    }
    std::vector<std::pair<int64_t, int64_t>> written;  // (dst offset, length) of every run
    for (int index : PiecesOf(rr.key)) {
      const Region stored = PieceRegion(manifest_.pieces(index));
      CKPT_ASSIGN_OR_RETURN(std::vector<CopyRun> runs, OverlapRuns(stored, rr.region, shape));
      if (runs.empty()) continue;
      int64_t lo = runs.front().src_offset, hi = 0;
      for (const CopyRun& r : runs) {
        lo = std::min(lo, r.src_offset);
        hi = std::max(hi, r.src_offset + r.length);
        written.emplace_back(r.dst_offset, r.length);
      }
      char* dest = static_cast<char*>(rr.dest);
      if (runs.size() == 1) {  // one contiguous run: read straight into place
        reads.push_back({index, lo * es, hi * es, dest + runs[0].dst_offset * es});
        continue;
      }
      Part part;
      for (CopyRun& r : runs) r.src_offset -= lo;
      part.runs = std::move(runs);
      part.buf.reset(new char[std::max<int64_t>(1, (hi - lo) * es)]);
      part.elem_size = es;
      part.dest = dest;
      reads.push_back({index, lo * es, hi * es, part.buf.get()});
      parts.push_back(std::move(part));
    }
    // Every element of the destination is written exactly once (Open validated the coverage
    // of each tensor; this guards the buffer itself): never a hole of stale bytes.
    CKPT_RETURN_IF_ERROR(RunTilingStatus(
        FindRunTilingFault(std::move(written), rr.region.NumElements()),
        absl::StrCat("tensor \"", rr.key, "\" region ", rr.region.DebugString(), " in ", path_)));
  }
  CKPT_RETURN_IF_ERROR(ReadPieces(reads));
  for (const Part& part : parts) CopyRuns(part.runs, part.elem_size, part.buf.get(), part.dest);
  return absl::OkStatus();
}

}  // namespace ckpt
