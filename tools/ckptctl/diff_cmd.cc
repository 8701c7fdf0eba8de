// ckptctl diff A B: compares two checkpoints of any format and layout tensor by tensor (keys
// missing on either side, dtype and shape differences, and for the rest the first differing
// element with its index), reading both in bounded chunks. Exit 0 same, 1 different, 2 error.
#include <cinttypes>
#include <cstdio>
#include <exception>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/store_url.h"
#include "sharding/region.h"
#include "storage/tensor_compare.h"
#include "storage/tensor_source.h"
#include "tools/ckptctl/cli_args.h"
#include "tools/ckptctl/commands.h"
#include "tools/ckptctl/dcp_bridge.h"

namespace ckpt::ckptctl {
namespace {

constexpr char kCmd[] = "diff";
constexpr int64_t kDefaultBudget = int64_t{256} << 20;

constexpr char kDescription[] =
    "Compares two checkpoints tensor by tensor, whatever their formats and layouts: a ckpt\n"
    "checkpoint (any sharding), safetensors (a file, a directory of them, or an index .json)\n"
    "or a PyTorch DCP / torch_dist directory (.metadata; first imported into a temporary ckpt\n"
    "checkpoint under $TMPDIR, see ckptctl import --help), or a ckpt checkpoint at an s3:// URL\n"
    "(read in place: ranged GETs of the bytes compared, checksums verified, nothing written to\n"
    "local disk). Reports keys only in A or only in\n"
    "B, dtype and shape differences, and for tensors whose elements differ (bit for bit: -0.0\n"
    "differs from 0.0, NaNs compare by their bits) the count, the first differing element\n"
    "with its index and both values, and for floats the largest finite |a - b|. Both sides\n"
    "are read in chunks of at most half of --memory-budget each, so any size compares in\n"
    "bounded memory. At most --max-reports lines are printed per kind of difference; the\n"
    "summary counts all.\n"
    "Exit status: 0 identical, 1 different, 2 error (a side unreadable, corrupt, bad usage).\n";

std::string ShapeText(const std::vector<int64_t>& shape) { return ShapeString(shape); }

struct Totals {
  int64_t compared = 0, differing = 0, bytes = 0;
};

// Compares the contents of one tensor both sides hold with equal dtype and shape. Prints a
// line when they differ.
absl::Status CompareTensor(const TensorSource& a, const TensorSource& b, const TensorDescription& t,
                           int64_t chunk_bytes, std::vector<char>* buf_a, std::vector<char>* buf_b,
                           bool print, Totals* totals) {
  const int64_t size = DTypeSize(t.dtype);
  int64_t n = 1;
  for (int64_t d : t.shape) n *= d;
  TensorComparison comparison(t.dtype);
  for (auto [start, stop] : ElementChunks(n, std::max<int64_t>(1, chunk_bytes / size))) {
    const int64_t bytes = (stop - start) * size;
    if (static_cast<int64_t>(buf_a->size()) < bytes) {
      buf_a->resize(bytes);
      buf_b->resize(bytes);
    }
    if (absl::Status s = a.ReadElements(t.key, start, stop, buf_a->data()); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("A: ", s.message()));
    }
    if (absl::Status s = b.ReadElements(t.key, start, stop, buf_b->data()); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("B: ", s.message()));
    }
    comparison.AddChunk(start, absl::Span<const char>(buf_a->data(), bytes),
                        absl::Span<const char>(buf_b->data(), bytes));
    totals->bytes += bytes;
  }
  ++totals->compared;
  const ElementDifference& r = comparison.result();
  if (r.differing == 0) return absl::OkStatus();
  ++totals->differing;
  if (!print) return absl::OkStatus();
  std::string line = absl::StrFormat(
      "values differ: %s (%s %s): %d of %d elements; first at [%s] (element %d): A %s, B %s", t.key,
      DTypeName(t.dtype), ShapeText(t.shape), r.differing, n,
      absl::StrJoin(UnravelIndex(t.shape, r.first_index), ", "), r.first_index, r.first_a,
      r.first_b);
  if (r.max_abs_difference) {
    absl::StrAppendFormat(&line, "; max |a-b| %.9g", *r.max_abs_difference);
  }
  if (r.non_finite_difference) line += "; some differ in NaN/inf";
  std::printf("%s\n", line.c_str());
  return absl::OkStatus();
}

// Prints at most `max` lines of one kind, then how many were left out.
void PrintCapped(const std::vector<std::string>& lines, int64_t max) {
  for (size_t i = 0; i < lines.size() && static_cast<int64_t>(i) < max; ++i) {
    std::printf("%s\n", lines[i].c_str());
  }
  if (static_cast<int64_t>(lines.size()) > max) {
    std::printf("... and %zu more like these\n", lines.size() - static_cast<size_t>(max));
  }
}

// Opens side `label` ("A" or "B") at `path`; a DCP directory is first imported into a
// temporary checkpoint, kept in *imports until the comparison ends.
absl::StatusOr<std::unique_ptr<TensorSource>> OpenSide(
    const std::string& label, std::string path, int64_t budget, const IoOptions& io,
    std::vector<std::unique_ptr<TemporaryImport>>* imports) {
  auto prefixed = [&](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat(label, ": ", s.message()));
  };
  // An s3:// side is read in place by OpenTensorSource (CheckpointReader's ranged GETs).
  if (!IsObjectStoreLocation(path) && IsDcpCheckpointDir(path)) {
    auto imported = ImportDcpTemporarily(path, budget);
    if (!imported.ok()) return prefixed(imported.status());
    path = (*imported)->path();
    imports->push_back(std::move(*imported));
  }
  auto source = OpenTensorSource(path, io);
  if (!source.ok()) return prefixed(source.status());
  return std::move(*source);
}

// Prints the keys only one side holds and those whose dtype or shape differ.
void PrintListDifferences(const TensorListDiff& lists, int64_t max_reports) {
  std::vector<std::string> lines;
  for (const std::string& k : lists.only_in_a) lines.push_back("only in A: " + k);
  PrintCapped(lines, max_reports);
  lines.clear();
  for (const std::string& k : lists.only_in_b) lines.push_back("only in B: " + k);
  PrintCapped(lines, max_reports);
  lines.clear();
  for (const auto& [x, y] : lists.mismatched) {
    const char* what = x.dtype != y.dtype
                           ? (x.shape != y.shape ? "dtype and shape differ" : "dtype differs")
                           : "shape differs";
    lines.push_back(absl::StrCat(what, ": ", x.key, ": A ", DTypeName(x.dtype), " ",
                                 ShapeText(x.shape), ", B ", DTypeName(y.dtype), " ",
                                 ShapeText(y.shape)));
  }
  PrintCapped(lines, max_reports);
}

// Compares both sides and prints the differences and the summary; the exit code.
int Compare(const TensorSource& side_a, const TensorSource& side_b, int64_t budget,
            int64_t max_reports) {
  std::printf("A: %s (%zu tensors)\nB: %s (%zu tensors)\n", side_a.Describe().c_str(),
              side_a.tensors().size(), side_b.Describe().c_str(), side_b.tensors().size());
  const TensorListDiff lists = DiffTensorLists(side_a.tensors(), side_b.tensors());
  PrintListDifferences(lists, max_reports);
  Totals totals;
  std::vector<char> buf_a, buf_b;
  for (const TensorDescription& t : lists.comparable) {
    const bool print = totals.differing < max_reports;
    if (absl::Status s =
            CompareTensor(side_a, side_b, t, budget / 2, &buf_a, &buf_b, print, &totals);
        !s.ok()) {
      std::fprintf(stderr, "ckptctl diff: %s\n", std::string(s.message()).c_str());
      return 2;
    }
  }
  if (totals.differing > max_reports) {
    std::printf("... and %" PRId64 " more tensors whose values differ\n",
                totals.differing - max_reports);
  }
  const bool same = lists.only_in_a.empty() && lists.only_in_b.empty() &&
                    lists.mismatched.empty() && totals.differing == 0;
  std::printf("%s: %zu only in A, %zu only in B, %zu with other dtype/shape, %" PRId64
              " of %" PRId64 " compared differ in values (%s compared per side)\n",
              same ? "identical" : "different", lists.only_in_a.size(), lists.only_in_b.size(),
              lists.mismatched.size(), totals.differing, totals.compared,
              HumanBytes(totals.bytes).c_str());
  return same ? 0 : 1;
}

int Diff(const std::vector<std::string>& args) {
  ParsedArgs a;
  if (std::optional<int> code = ParseCommandLine(DiffSpec(), args, &a)) return *code;
  if (a.positional.size() != 2) return Usage(kCmd, "expected two checkpoints <A> <B>");
  IoOptions io;
  int64_t budget = kDefaultBudget;
  int64_t max_reports = 100;
  absl::Status s = IoFromFlags(a, &io);
  if (s.ok()) s = SizeFlag(a, "memory-budget", 2 * 64, &budget);
  if (s.ok()) s = IntFlag(a, "max-reports", 0, std::numeric_limits<int64_t>::max(), &max_reports);
  if (!s.ok()) return Usage(kCmd, std::string(s.message()));

  // DCP sides are imported into temporary ckpt checkpoints first (removed on return).
  std::vector<std::unique_ptr<TemporaryImport>> imports;
  std::vector<std::unique_ptr<TensorSource>> sides;
  for (int i = 0; i < 2; ++i) {
    auto side = OpenSide(i == 0 ? "A" : "B", a.positional[i], budget, io, &imports);
    if (!side.ok()) {
      std::fprintf(stderr, "ckptctl diff: %s\n", std::string(side.status().message()).c_str());
      return 2;
    }
    sides.push_back(std::move(*side));
  }
  return Compare(*sides[0], *sides[1], budget, max_reports);
}

}  // namespace

const CommandSpec& DiffSpec() {
  static const CommandSpec* spec = new CommandSpec{
      kCmd, "usage: ckptctl diff <A> <B> [flags]", kDescription,
      With({{"memory-budget", "SIZE", "memory for both sides' chunks (default 256MiB)"},
            {"max-reports", "N", "lines printed per kind of difference (default 100)"}},
           IoFlagSpecs())};
  return *spec;
}

// No library exception (std::bad_alloc) ends the process: one line, exit 2.
int RunDiffCommand(const std::vector<std::string>& args) {
  try {
    return Diff(args);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ckptctl diff: %s\n", e.what());
    return 2;
  }
}

}  // namespace ckpt::ckptctl
