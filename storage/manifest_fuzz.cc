// Fuzz target: manifest.pb bytes through ParseManifestHead (protobuf parse + format checks:
// version 1 without piece files, version 2 with well-named piece files and no pieces of its
// own) and ParseManifest (+ ValidateManifest), and through the streaming reader
// (StreamManifestBytes: a head pass, then the pieces parsed one record at a time), which must
// give ParseManifest's verdict: the same error code, or the same head and pieces. A head accepted
// in format 2 must list only ManifestPieceFileName(i) names and hold no pieces, and ParseManifest
// must send it to the piece files instead of accepting it. Anything may be rejected; an accepted
// manifest must be internally consistent, which is checked independently here: it serializes and
// parses back to the same bytes; every piece's tensor and file are listed; each data file's pieces
// found by ManifestIndex add up to all pieces; and for tensors of at most 4096 elements, marking
// every element of every piece stores each element exactly once (the brute-force twin of the
// coverage check). Any violation aborts (a finding).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/stubs/logging.h"
#include "sharding/region.h"
#include "storage/manifest_codec.h"
#include "storage/manifest_file.h"

namespace {

void Check(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "manifest_fuzz: %s\n", what);
  std::abort();
}

// Every element of a small tensor (`n` elements) stored exactly once, by marking them.
bool TiledByBruteForce(const std::vector<int64_t>& shape, int64_t n,
                       const std::vector<ckpt::Region>& pieces) {
  std::vector<int> marks(static_cast<size_t>(n), 0);
  for (const ckpt::Region& r : pieces) {
    const int d = r.ndim();
    std::vector<int64_t> idx(d, 0);
    for (int64_t i = 0; i < r.BoxElements(); ++i) {
      if (!r.flat || (i >= r.flat->start && i < r.flat->stop)) {
        int64_t g = 0;
        for (int k = 0; k < d; ++k) g = g * shape[k] + r.offsets[k] + idx[k];
        ++marks[g];
      }
      for (int k = d - 1; k >= 0; --k) {
        if (++idx[k] < r.lengths[k]) break;
        idx[k] = 0;
      }
    }
  }
  for (int m : marks) {
    if (m != 1) return false;
  }
  return true;
}

// Rejected manifests are the point here: keep protobuf from logging each invalid UTF-8 string.
[[maybe_unused]] const bool kQuietProtobuf = [] {
  google::protobuf::SetLogHandler(nullptr);
  return true;
}();

// The format checks of ParseManifestHead, checked independently.
void CheckHead(absl::string_view bytes) {
  auto head = ckpt::ParseManifestHead(bytes, "fuzz/manifest.pb");
  if (!head.ok()) {
    Check(!head.status().message().empty(), "a head error without a message");
    return;
  }
  if (head->format_version() == ckpt::kManifestFormatVersion) {
    Check(head->piece_files_size() == 0, "format 1 accepted with piece files");
    return;
  }
  Check(head->format_version() == ckpt::kManifestPieceFilesFormatVersion,
        "an unknown format accepted");
  Check(head->pieces_size() == 0, "format 2 accepted with pieces of its own");
  Check(head->piece_files_size() > 0, "format 2 accepted without piece files");
  for (int i = 0; i < head->piece_files_size(); ++i) {
    const std::string& name = head->piece_files(i).name();
    Check(name == ckpt::ManifestPieceFileName(i) && ckpt::IsManifestPieceFileName(name) &&
              name.find('/') == std::string::npos,
          "a piece file name outside the expected form accepted");
  }
  Check(absl::IsFailedPrecondition(ckpt::ParseManifest(bytes, "fuzz/manifest.pb").status()),
        "ParseManifest took a format-2 manifest without its piece files");
}

// The streaming reader agrees with the whole-message parse `whole` of the same bytes.
void CheckStream(absl::string_view bytes, const absl::StatusOr<ckpt::pb::Manifest>& whole) {
  ckpt::pb::Manifest streamed;
  int64_t next = 0;
  auto head = ckpt::StreamManifestBytes(bytes, "fuzz/manifest.pb",
                                        [&](int64_t index, ckpt::pb::StoredPiece& piece) {
                                          Check(index == next++, "pieces streamed out of order");
                                          *streamed.add_pieces() = std::move(piece);
                                          return absl::OkStatus();
                                        });
  Check(head.status().code() == whole.status().code(),
        "the streaming reader's verdict differs from a whole parse");
  if (!head.ok()) return;
  Check(head->pieces_size() == 0, "the streamed head holds pieces");
  streamed.MergeFrom(*head);
  Check(ckpt::SerializeManifest(streamed) == ckpt::SerializeManifest(*whole),
        "the streamed manifest differs from a whole parse");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  CheckHead(bytes);
  auto m = ckpt::ParseManifest(bytes, "fuzz/manifest.pb");
  CheckStream(bytes, m);
  if (!m.ok()) {
    Check(!m.status().message().empty(), "an error without a message");
    return 0;
  }
  const std::string serialized = ckpt::SerializeManifest(*m);
  auto again = ckpt::ParseManifest(serialized, "again");
  Check(again.ok() && ckpt::SerializeManifest(*again) == serialized,
        "an accepted manifest does not round-trip");

  const ckpt::ManifestIndex index(*m);
  size_t in_files = 0;
  for (const ckpt::pb::DataFile& f : m->files()) in_files += index.PiecesInFile(f.name()).size();
  Check(in_files == static_cast<size_t>(m->pieces_size()), "a piece is in no listed file");

  std::map<int, std::vector<ckpt::Region>> regions;
  for (int i = 0; i < m->pieces_size(); ++i) {
    const int t = index.TensorIndex(m->pieces(i).key());
    Check(t >= 0 && t == index.TensorOfPiece(i), "a piece's tensor is not listed");
    regions[t].push_back(ckpt::PieceRegion(m->pieces(i)));
  }
  for (int t = 0; t < m->tensors_size(); ++t) {
    const auto& gs = m->tensors(t).global_shape();
    const std::vector<int64_t> shape(gs.begin(), gs.end());
    auto n = ckpt::CheckedNumElements(shape);
    Check(n.ok(), "an accepted tensor shape is invalid");
    if (*n > 4096) continue;
    Check(TiledByBruteForce(shape, *n, regions[t]), "accepted pieces do not tile their tensor");
  }
  return 0;
}
