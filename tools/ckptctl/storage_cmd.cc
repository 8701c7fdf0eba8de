// ckptctl inspect / verify / import / export: offline work on checkpoint directories.
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/store_url.h"
#include "google/protobuf/util/json_util.h"
#include "nlohmann/json.hpp"
#include "sharding/dtype.h"
#include "sharding/region.h"
#include "storage/checkpoint_copy.h"
#include "storage/checkpoint_reader.h"
#include "storage/checkpoint_store.h"
#include "storage/export_transform.h"
#include "storage/file_util.h"
#include "storage/interop.h"
#include "storage/manifest_codec.h"
#include "storage/manifest_file.h"
#include "storage/piece_codec.h"
#include "storage/verify.h"
#include "tools/ckptctl/cli_args.h"
#include "tools/ckptctl/commands.h"
#include "tools/ckptctl/dcp_cmd.h"
#include "tools/ckptctl/store_staging.h"

namespace ckpt::ckptctl {
namespace {

using Json = nlohmann::json;

std::string Hex(uint64_t v) { return absl::StrFormat("%016x", v); }

std::string DTypeText(pb::DType d) {
  auto dt = DTypeFromProto(d);
  return dt.ok() ? std::string(DTypeName(*dt)) : "?";
}

Json RegionJson(const pb::Region& r) {
  Json j = {{"offsets", std::vector<int64_t>(r.offsets().begin(), r.offsets().end())},
            {"lengths", std::vector<int64_t>(r.lengths().begin(), r.lengths().end())}};
  if (r.has_flat()) j["flat"] = {r.flat().start(), r.flat().stop()};
  return j;
}

// Pieces `ckptctl inspect` lists one by one unless --max-listed-pieces says otherwise; above,
// only per-tensor figures (a manifest of millions of pieces is streamed, never held).
constexpr int64_t kDefaultMaxListedPieces = 100000;

// A tensor's figures over its stored pieces.
struct TensorFigures {
  int64_t pieces = 0;
  int64_t bytes = 0;          // raw
  int64_t stored_bytes = 0;   // in the data files (smaller when compressed)
  int64_t packed_pieces = 0;  // compressed
  uint32_t codec = 0;         // of the compressed pieces (the last seen)
};

// What inspect shows of a manifest read as a stream (StreamManifestFile): its head, each
// tensor's figures, and its pieces grouped by tensor when there are at most `max_listed`.
struct InspectedManifest {
  pb::Manifest head;
  absl::flat_hash_map<std::string, TensorFigures> figures;  // by tensor key
  int64_t pieces = 0;
  int64_t packed_pieces = 0;  // compressed (storage/piece_codec.h)
  bool pieces_listed = true;
  absl::flat_hash_map<std::string, std::vector<pb::StoredPiece>> listed;  // by tensor key
};

// Counts piece `p` into `out` (and lists it while at most `max_listed` pieces were seen).
void CountPiece(pb::StoredPiece& p, int64_t max_listed, InspectedManifest* out) {
  TensorFigures& f = out->figures[p.key()];
  ++f.pieces;
  f.bytes += p.byte_length();
  f.stored_bytes += StoredBytes(p);
  if (p.codec() != 0) {
    ++f.packed_pieces;
    f.codec = p.codec();
    ++out->packed_pieces;
  }
  if (++out->pieces > max_listed) {
    out->pieces_listed = false;
    out->listed.clear();
  } else {
    out->listed[p.key()].push_back(std::move(p));
  }
}

absl::StatusOr<InspectedManifest> InspectManifest(const std::string& path, int64_t max_listed) {
  InspectedManifest out;
  absl::StatusOr<pb::Manifest> head = StreamManifestFile(path, [&](int64_t, pb::StoredPiece& p) {
    CountPiece(p, max_listed, &out);
    return absl::OkStatus();
  });
  if (!head.ok()) return head.status();
  out.head = *std::move(head);
  return out;
}

// The same for a manifest a store (s3://) handed over whole.
InspectedManifest InspectWholeManifest(pb::Manifest manifest, int64_t max_listed) {
  InspectedManifest out;
  for (pb::StoredPiece& p : *manifest.mutable_pieces()) CountPiece(p, max_listed, &out);
  manifest.clear_pieces();
  out.head = std::move(manifest);
  return out;
}

std::string CodecText(uint32_t codec) {
  absl::StatusOr<PieceCodec> c = PieceCodecFromInt(codec);
  return c.ok() ? std::string(PieceCodecName(*c)) : absl::StrCat("unknown codec ", codec);
}

Json PieceJson(const pb::StoredPiece& p) {
  return {{"region", RegionJson(p.region())},
          {"file", p.file()},
          {"entry", p.entry_name()},
          {"byte_offset", p.byte_offset()},
          {"byte_length", p.byte_length()},
          {"xxh3_64", Hex(p.xxh3_64())},
          {"checksum_blocks", p.block_xxh3_size()},
          {"writer_rank", p.writer_rank()},
          {"codec", CodecText(p.codec())},
          {"stored_length", StoredBytes(p)}};
}

// Each tensor with its figures and, when listed, its pieces in manifest order.
Json TensorsJson(const InspectedManifest& in) {
  Json tensors = Json::array();
  for (const pb::TensorMeta& t : in.head.tensors()) {
    Json jt = {{"key", t.key()},
               {"dtype", DTypeText(t.dtype())},
               {"shape", std::vector<int64_t>(t.global_shape().begin(), t.global_shape().end())}};
    auto f = in.figures.find(t.key());
    const TensorFigures figures = f == in.figures.end() ? TensorFigures{} : f->second;
    jt["stored_bytes"] = figures.stored_bytes;
    jt["raw_bytes"] = figures.bytes;
    jt["piece_count"] = figures.pieces;
    jt["codec"] = figures.packed_pieces == 0 ? "none" : CodecText(figures.codec);
    jt["ratio"] =
        figures.bytes == 0 ? 1.0 : static_cast<double>(figures.stored_bytes) / figures.bytes;
    if (in.pieces_listed) {
      Json jp = Json::array();
      if (auto it = in.listed.find(t.key()); it != in.listed.end()) {
        for (const pb::StoredPiece& p : it->second) jp.push_back(PieceJson(p));
      }
      jt["pieces"] = std::move(jp);
    }
    tensors.push_back(std::move(jt));
  }
  return tensors;
}

Json ManifestJson(const std::string& path, const InspectedManifest& in) {
  const pb::Manifest& m = in.head;
  Json files = Json::array();
  int64_t total = 0;
  for (const pb::DataFile& f : m.files()) {
    total += f.size_bytes();
    files.push_back({{"name", f.name()},
                     {"size_bytes", f.size_bytes()},
                     {"writer_rank", f.writer_rank()},
                     {"data_start", f.data_start()}});
  }
  std::string layout;
  google::protobuf::util::JsonPrintOptions opts;
  opts.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(m.saved_layout(), &layout, opts);
  Json saved_layout = Json::parse(layout, nullptr, false);
  if (saved_layout.is_discarded()) saved_layout = Json::object();
  Json user = Json::object();
  for (const auto& [k, v] : m.user_metadata()) user[k] = v;
  return {{"path", path},
          {"state", "complete"},
          {"format_version", m.format_version()},
          {"writer_version", m.writer_version()},
          {"created_unix_micros", m.created_unix_micros()},
          {"step", m.step()},
          {"user_metadata", user},
          {"saved_layout", saved_layout},
          {"checksum_block_bytes", m.checksum_block_bytes()},
          {"manifest_piece_files", m.piece_files_size()},
          {"total_file_bytes", total},
          {"piece_count", in.pieces},
          {"compressed_pieces", in.packed_pieces},
          {"plain_safetensors_readable", in.packed_pieces == 0},
          {"pieces_listed", in.pieces_listed},
          {"files", files},
          {"tensors", TensorsJson(in)}};
}

void PrintManifestText(const std::string& path, const InspectedManifest& in, int64_t max_listed) {
  const pb::Manifest& m = in.head;
  Json j = ManifestJson(path, in);
  std::printf("checkpoint %s: complete, format version %u, written by %s\n", path.c_str(),
              m.format_version(), m.writer_version().c_str());
  std::printf("step %" PRId64 ", created %" PRId64 " (unix us)\n", m.step(),
              m.created_unix_micros());
  for (const auto& [k, v] : m.user_metadata())
    std::printf("  metadata %s = %s\n", k.c_str(), v.c_str());
  const pb::SavedLayout& l = m.saved_layout();
  if (l.world_size() > 0 || l.mesh_shape_size() > 0) {
    std::printf(
        "saved layout: world size %d, mesh %s, %d tensor layouts\n", l.world_size(),
        ShapeString(std::vector<int64_t>(l.mesh_shape().begin(), l.mesh_shape().end())).c_str(),
        l.tensors_size());
  }
  std::printf("%d data files, %s; %d tensors, %" PRId64 " pieces\n", m.files_size(),
              HumanBytes(j["total_file_bytes"].get<int64_t>()).c_str(), m.tensors_size(),
              in.pieces);
  if (m.piece_files_size() > 0) {
    std::printf("manifest pieces in %d piece files beside manifest.pb\n", m.piece_files_size());
  }
  if (in.packed_pieces > 0) {
    std::printf("compressed: %" PRId64 " of %" PRId64
                " pieces (their data files are not readable as tensors by a plain safetensors "
                "reader; ckptctl export writes plain safetensors)\n",
                in.packed_pieces, in.pieces);
  }
  if (!in.pieces_listed) {
    std::printf("pieces not listed: more than %" PRId64 " (see --max-listed-pieces)\n", max_listed);
  }
  for (const Json& t : j["tensors"]) {
    std::printf("%s  %s %s  %s in %" PRId64 " piece(s)", t["key"].get<std::string>().c_str(),
                t["dtype"].get<std::string>().c_str(),
                ShapeString(t["shape"].get<std::vector<int64_t>>()).c_str(),
                HumanBytes(t["raw_bytes"].get<int64_t>()).c_str(), t["piece_count"].get<int64_t>());
    if (t["codec"] != "none") {
      std::printf(", %s: %s stored (%.1f%%)", t["codec"].get<std::string>().c_str(),
                  HumanBytes(t["stored_bytes"].get<int64_t>()).c_str(),
                  100.0 * t["ratio"].get<double>());
    }
    std::printf("\n");
    if (!t.contains("pieces")) continue;
    for (const Json& p : t["pieces"]) {
      std::printf("    %-40s %s @%" PRId64 " +%" PRId64 " xxh3 %s\n",
                  p["entry"].get<std::string>().c_str(), p["file"].get<std::string>().c_str(),
                  p["byte_offset"].get<int64_t>(), p["byte_length"].get<int64_t>(),
                  p["xxh3_64"].get<std::string>().c_str());
    }
  }
}

// Prints what is at `path` when it is not a complete checkpoint; returns the exit code.
int ReportNotComplete(const std::string& cmd, const std::string& path, const CheckpointProbe& probe,
                      bool json) {
  const std::string what =
      probe.state == CheckpointState::kIncomplete
          ? absl::StrCat(path,
                         " is an incomplete checkpoint: no manifest.pb (an interrupted or "
                         "in-progress write); it is never loaded")
          : absl::StrCat(path, ": ", CheckpointStateName(probe.state));
  if (json) {
    Json j = {{"path", path},
              {"state", CheckpointStateName(probe.state)},
              {"leftovers", probe.leftovers}};
    std::printf("%s\n", j.dump(2, ' ', false, Json::error_handler_t::replace).c_str());
  }
  for (const std::string& l : probe.leftovers) {
    std::fprintf(stderr, "note: leftover %s\n", l.c_str());
  }
  return Fail(cmd, absl::FailedPreconditionError(what));
}

int RunInspect(const std::vector<std::string>& args) {
  const std::string cmd = "inspect";
  ParsedArgs a;
  if (std::optional<int> code = ParseCommandLine(InspectSpec(), args, &a)) return *code;
  if (a.positional.size() != 1) return Usage(cmd, "expected exactly one checkpoint path");
  int64_t max_listed = kDefaultMaxListedPieces;
  if (absl::Status s =
          IntFlag(a, "max-listed-pieces", 0, std::numeric_limits<int64_t>::max(), &max_listed);
      !s.ok()) {
    return Usage(cmd, std::string(s.message()));
  }
  const std::string& path = a.positional[0];
  const bool json = a.Has("json");
  if (IsObjectStoreLocation(path)) {  // s3:// and other stores: the manifest through the store
    absl::StatusOr<CheckpointStore*> store = StoreForUrl(path);
    if (!store.ok()) return Fail(cmd, store.status());
    auto stored = (*store)->Open(path, absl::Now() + absl::Minutes(5));
    if (!stored.ok()) return Fail(cmd, stored.status());
    const InspectedManifest m = InspectWholeManifest((*stored)->manifest(), max_listed);
    if (json) {
      std::printf(
          "%s\n",
          ManifestJson(path, m).dump(2, ' ', false, Json::error_handler_t::replace).c_str());
    } else {
      PrintManifestText(path, m, max_listed);
    }
    return 0;
  }
  CheckpointProbe probe = ProbeCheckpoint(path);
  if (probe.state != CheckpointState::kComplete) return ReportNotComplete(cmd, path, probe, json);
  auto m = InspectManifest(path, max_listed);
  if (!m.ok()) return Fail(cmd, m.status());
  if (json) {
    Json j = ManifestJson(path, *m);
    j["leftovers"] = probe.leftovers;
    std::printf("%s\n", j.dump(2, ' ', false, Json::error_handler_t::replace).c_str());
  } else {
    PrintManifestText(path, *m, max_listed);
    for (const std::string& l : probe.leftovers) std::printf("note: leftover %s\n", l.c_str());
  }
  return 0;
}

int RunVerify(const std::vector<std::string>& args) {
  const std::string cmd = "verify";
  ParsedArgs a;
  if (std::optional<int> code = ParseCommandLine(VerifySpec(), args, &a)) return *code;
  if (a.positional.size() != 1) return Usage(cmd, "expected exactly one checkpoint path");
  IoOptions io;
  if (absl::Status s = IoFromFlags(a, &io); !s.ok()) return Usage(cmd, std::string(s.message()));
  // A directory is verified in place; any other store (s3://) through its store.
  auto report = !IsObjectStoreLocation(a.positional[0]) ? VerifyCheckpoint(a.positional[0], io)
                                                        : VerifyStoredCheckpoint(a.positional[0]);
  if (!report.ok()) return Fail(cmd, report.status());
  for (const std::string& p : report->problems) {
    std::fprintf(stderr, "ckptctl verify: %s\n", p.c_str());
  }
  if (!report->problems.empty()) {
    std::fprintf(stderr, "ckptctl verify: %s: %zu problem(s) found\n", a.positional[0].c_str(),
                 report->problems.size());
    return 1;
  }
  const std::string piece_files =
      report->manifest_piece_files > 0
          ? absl::StrCat(", manifest in ", report->manifest_piece_files, " piece files")
          : "";
  std::printf("%s: OK (%" PRId64 " tensors, %" PRId64 " pieces, %" PRId64
              " files, %s checksummed, coverage exact%s)\n",
              a.positional[0].c_str(), report->tensors, report->pieces, report->files,
              HumanBytes(report->bytes_checked).c_str(), piece_files.c_str());
  return 0;
}

int RunImport(const ParsedArgs& a) {
  const std::string cmd = "import";
  if (a.Has("from")) return Usage(cmd, "--from must be dcp (safetensors sources need no --from)");
  if (absl::Status s = RefuseFlags(a, {"workers", "memory-budget", "step"},
                                   "applies only to DCP sources (--from dcp)");
      !s.ok()) {
    return Usage(cmd, std::string(s.message()));
  }
  if (a.positional.size() != 2) return Usage(cmd, "expected <source> <checkpoint>");
  if (absl::Status s = RequireLocal(a.positional[0], "source"); !s.ok()) {
    return Usage(cmd, std::string(s.message()));
  }
  WriteOptions wo;
  if (absl::Status s = IoFromFlags(a, &wo.io); !s.ok()) {
    return Usage(cmd, std::string(s.message()));
  }
  wo.overwrite = a.Has("overwrite");
  auto dest = WritableCheckpoint::Create(a.positional[1], wo.overwrite);  // s3:// via a copy
  if (!dest.ok()) return Fail(cmd, dest.status());
  auto m = ImportSafetensors(a.positional[0], (*dest)->path(), wo);
  if (!m.ok()) return Fail(cmd, m.status());
  if (absl::Status s = (*dest)->Publish(); !s.ok()) return Fail(cmd, s);
  int64_t bytes = 0;
  for (const auto& p : m->pieces()) bytes += p.byte_length();
  std::printf("imported %d tensors (%s) from %s into %s\n", m->tensors_size(),
              HumanBytes(bytes).c_str(), a.positional[0].c_str(), a.positional[1].c_str());
  return 0;
}

int RunExport(const ParsedArgs& a) {
  const std::string cmd = "export";
  if (a.Has("to")) return Usage(cmd, "--to must be dcp (safetensors needs no --to)");
  if (absl::Status s = RefuseFlags(a, {"layout", "workers", "memory-budget"},
                                   "applies only to DCP exports (--to dcp)");
      !s.ok()) {
    return Usage(cmd, std::string(s.message()));
  }
  if (a.positional.size() != 2) return Usage(cmd, "expected <checkpoint> <out>");
  if (absl::Status s = RequireLocal(a.positional[1], "output"); !s.ok()) {
    return Usage(cmd, std::string(s.message()));
  }
  ExportOptions eo;
  absl::Status s = IoFromFlags(a, &eo.io);
  if (s.ok()) s = SizeFlag(a, "max-file-size", 1, &eo.max_file_bytes);
  if (!s.ok()) return Usage(cmd, std::string(s.message()));
  eo.overwrite = a.Has("overwrite");
  if (a.Has("dtype")) {
    auto dtype = ParseDType(absl::AsciiStrToUpper(a.Get("dtype")));
    if (!dtype.ok() || !IsConvertibleFloat(*dtype)) {
      return Usage(
          cmd, absl::StrCat("--dtype must be BF16, F16, F32 or F64, not \"", a.Get("dtype"), "\""));
    }
    eo.float_dtype = *dtype;
  }
  if (a.Has("rename")) {
    const std::string path = a.Get("rename");
    auto text = ReadWholeFile(path, int64_t{64} << 20);
    if (!text.ok()) return Fail(cmd, text.status());
    auto mapping = ParseKeyMapping(*text, path);
    if (!mapping.ok()) return Fail(cmd, mapping.status());
    eo.rename = *std::move(mapping);
  }
  // An s3:// checkpoint is read in place (CheckpointReader: ranged GETs, checksums verified).
  auto files = ExportCheckpoint(a.positional[0], a.positional[1], eo);
  if (!files.ok()) return Fail(cmd, files.status());
  for (const std::string& f : *files) std::printf("wrote %s\n", f.c_str());
  return 0;
}

}  // namespace

const CommandSpec& InspectSpec() {
  static const CommandSpec* spec = new CommandSpec{
      "inspect",
      "usage: ckptctl inspect <checkpoint> [--json] [--max-listed-pieces N]",
      "Shows a checkpoint's tensors (dtype, shape, stored bytes, piece count), its stored\n"
      "pieces (region, data file, offset, length, checksum) when there are at most\n"
      "--max-listed-pieces of them (default 100000; above, per-tensor figures only, and the\n"
      "JSON's tensors have no \"pieces\" and \"pieces_listed\" is false), the saved layout and\n"
      "user metadata. The manifest is streamed, so a manifest of millions of pieces is never\n"
      "held in memory. A directory without manifest.pb is reported as incomplete (exit 1).\n"
      "Does not read tensor data; use `ckptctl verify` for that.\n",
      {{"json", "", "print one JSON object"},
       {"max-listed-pieces", "N", "list pieces one by one only up to N pieces (default 100000)"}}};
  return *spec;
}

const CommandSpec& VerifySpec() {
  static const CommandSpec* spec = new CommandSpec{
      "verify", "usage: ckptctl verify <checkpoint> [flags]",
      "Checks that the manifest is valid and agrees with every data file's safetensors\n"
      "header and size, that every element of every tensor is stored by exactly one piece,\n"
      "and reads every stored byte verifying its XXH3-64 checksums. Exit 0 when sound, 1\n"
      "with one line per problem otherwise.\n",
      IoFlagSpecs()};
  return *spec;
}

const CommandSpec& ImportSpec() {
  static const CommandSpec* spec = new CommandSpec{
      "import",
      "usage: ckptctl import <file.safetensors | dir | model.safetensors.index.json>\n"
      "                      <checkpoint> [flags]\n"
      "       ckptctl import --from dcp <dcp-dir> <checkpoint> [flags]",
      absl::StrCat(
          "Converts a Hugging Face-style safetensors checkpoint into a ckpt checkpoint (each\n"
          "tensor stored whole), committed atomically, so it can be loaded into any sharded\n"
          "layout. An existing checkpoint is replaced only with --overwrite, which refuses to\n"
          "replace anything that is not a committed ckpt checkpoint.\n\n",
          kStoreStagingHelp, kDcpImportHelp),
      With(With({{"overwrite", "", "replace an existing committed checkpoint (only)"}},
                IoFlagSpecs()),
           DcpImportFlagSpecs())};
  return *spec;
}

const CommandSpec& ExportSpec() {
  static const CommandSpec* spec = new CommandSpec{
      "export",
      "usage: ckptctl export <checkpoint> <out.safetensors | out-dir> [flags]\n"
      "       ckptctl export --to dcp <checkpoint> <dcp-dir> [flags]",
      absl::StrCat(
          "Consolidates every tensor into one full, unsharded tensor and writes safetensors:\n"
          "a single file, or in a directory model.safetensors, or model-0000i-of-0000n\n"
          "files plus model.safetensors.index.json when --max-file-size (e.g. 5GB, 500MiB)\n"
          "splits them. Checksums are verified while reading. --overwrite replaces an earlier\n"
          "export's files (regular files named as above; stale shards of it are removed) and\n"
          "never touches anything else in the directory.\n"
          "--dtype writes every floating-point tensor (F64/F32/F16/BF16) as that dtype, e.g.\n"
          "BF16 for fp32 master weights (round to nearest even, as torch); others keep theirs.\n"
          "--rename map.json ({\"old key\": \"new key\", ...}) renames tensors on the way out;\n"
          "every mapped key must exist and no two tensors may get one name.\n\n",
          kStoreStagingHelp, kDcpExportHelp),
      With(With({{"overwrite", "", "replace an earlier export's files (only those)"},
                 {"max-file-size", "SIZE", "split into files of at most SIZE (e.g. 5GB)"},
                 {"dtype", "BF16|F16|F32|F64", "write floating-point tensors as this dtype"},
                 {"rename", "FILE", "rename tensors by the JSON map in FILE"}},
                IoFlagSpecs()),
           DcpExportFlagSpecs())};
  return *spec;
}

int RunInspectCommand(const std::vector<std::string>& args) { return RunInspect(args); }
int RunVerifyCommand(const std::vector<std::string>& args) { return RunVerify(args); }
// DCP sources and destinations go to tools/ckptctl/dcp_cmd.cc.
int RunImportCommand(const std::vector<std::string>& args) {
  ParsedArgs a;
  if (std::optional<int> code = ParseCommandLine(ImportSpec(), args, &a)) return *code;
  return WantsDcp(a, "from", /*detect_source=*/true) ? RunDcpImport(a) : RunImport(a);
}
int RunExportCommand(const std::vector<std::string>& args) {
  ParsedArgs a;
  if (std::optional<int> code = ParseCommandLine(ExportSpec(), args, &a)) return *code;
  return WantsDcp(a, "to", /*detect_source=*/false) ? RunDcpExport(a) : RunExport(a);
}

}  // namespace ckpt::ckptctl
