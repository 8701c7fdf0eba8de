// Loads from s3:// through CheckpointReader (storage/store_objects.h: ranged GETs in parallel,
// every byte verified) against the limit: the same S3 client's ranged GETs of the same bytes,
// cut the same way, at the same concurrency, unverified. Also the same checkpoint read from a
// directory (page cache warm) for reference. On a real one-node Swift with s3api started here
// (storage/s3/testing). A tool, never a test:
//   bazel build -c opt //tools/bench:s3_read_benchmark &&
//   bazel-out/k8-opt/bin/tools/bench/s3_read_benchmark --size_mb=512 --files=8 --repeat=3
// Flags (--name=value): size_mb, files, repeat, threads, depth, buffer_mb (IoOptions).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "storage/checkpoint_copy.h"
#include "storage/checkpoint_reader.h"
#include "storage/checkpoint_writer.h"
#include "storage/file_util.h"
#include "storage/s3/s3_client.h"
#include "storage/s3/testing/s3_test_server.h"
#include "storage/store_objects.h"

namespace ckpt {
namespace {

constexpr char kBucket[] = "s3readbench";

void Die(const absl::Status& s, const char* what) {
  if (s.ok()) return;
  std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
  std::exit(1);
}

int64_t Flag(int argc, char** argv, const std::string& name, int64_t fallback) {
  const std::string prefix = absl::StrCat("--", name, "=");
  for (int i = 1; i < argc; ++i) {
    int64_t v = 0;
    const std::string arg = argv[i];
    if (arg.rfind(prefix, 0) == 0 && absl::SimpleAtoi(arg.substr(prefix.size()), &v)) return v;
  }
  return fallback;
}

double Seconds(const std::function<void()>& f) {
  const auto start = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// `files` data files of one f32 tensor each, `bytes` in all, of random bytes.
CheckpointContents Contents(int64_t bytes, int files, std::vector<std::string>& data) {
  CheckpointContents contents;
  std::mt19937_64 rng(1);
  const int64_t per = bytes / files / 4;
  for (int f = 0; f < files; ++f) {
    const std::string key = absl::StrCat("t", f);
    data.emplace_back(per * 4, '\0');
    for (size_t i = 0; i + 8 <= data.back().size(); i += 8) {
      const uint64_t v = rng();
      std::memcpy(&data.back()[i], &v, 8);
    }
    contents.tensors.push_back(TensorMeta{key, DType::kF32, {per}});
    contents.files.push_back(DataFilePlan{
        f, {PieceData{key, Region{{0}, {per}, std::nullopt}, data.back().data(), per * 4}}});
  }
  return contents;
}

// Every tensor of the checkpoint at `location`, whole, through one ReadRegions.
void ReadAll(const std::string& location, const ReaderOptions& options,
             std::vector<std::string>& out) {
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
      CheckpointReader::Open(location, options);
  Die(reader.status(), "open");
  std::vector<CheckpointReader::RegionRead> reads;
  for (int t = 0; t < (*reader)->manifest().tensors_size(); ++t) {
    const pb::TensorMeta& meta = (*reader)->manifest().tensors(t);
    const int64_t n = meta.global_shape(0);
    out[t].resize(n * 4);
    reads.push_back({meta.key(), Region{{0}, {n}, std::nullopt}, out[t].data()});
  }
  Die((*reader)->ReadRegions(reads), "read");
}

// The limit: ranged GETs of every data object, in `chunk` pieces, on `threads` threads.
void GetAll(S3Client& client, const std::vector<std::pair<std::string, int64_t>>& objects,
            int64_t chunk, int threads, std::vector<std::string>& out) {
  struct Get {
    size_t object;
    int64_t offset, length;
  };
  std::vector<Get> gets;
  for (size_t o = 0; o < objects.size(); ++o) {
    out[o].resize(objects[o].second);
    for (int64_t b = 0; b < objects[o].second; b += chunk) {
      gets.push_back({o, b, std::min(chunk, objects[o].second - b)});
    }
  }
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t j; (j = next.fetch_add(1)) < gets.size();) {
      const Get& g = gets[j];
      Die(client.GetObjectRange(kBucket, objects[g.object].first, g.offset,
                                absl::MakeSpan(&out[g.object][g.offset], g.length),
                                absl::Now() + absl::Minutes(5)),
          "get");
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
}

int Main(int argc, char** argv) {
  const int64_t bytes = Flag(argc, argv, "size_mb", 512) << 20;
  const int files = static_cast<int>(Flag(argc, argv, "files", 8));
  const int repeat = static_cast<int>(Flag(argc, argv, "repeat", 3));
  ReaderOptions options;
  options.io.num_threads = static_cast<int>(Flag(argc, argv, "threads", 4));
  options.io.queue_depth = static_cast<int>(Flag(argc, argv, "depth", 4));
  options.io.buffer_bytes = Flag(argc, argv, "buffer_mb", 8) << 20;
  const int concurrency = options.io.num_threads * options.io.queue_depth;

  absl::StatusOr<std::unique_ptr<S3TestServer>> server = S3TestServer::Start();
  Die(server.status(), "start swift");
  (*server)->ExportAwsEnvironment();
  std::unique_ptr<S3Client> client = *S3Client::Create((*server)->ClientOptions());
  Die(client->CreateBucket(kBucket, absl::Now() + absl::Minutes(1)), "bucket");
  char tmpl[] = "/tmp/s3-read-bench-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) Die(absl::InternalError("mkdtemp"), "temp dir");
  const std::string root = tmpl;  // this run's own
  const std::string dir = JoinPath(root, "ckpt");
  std::vector<std::string> data;
  Die(WriteCheckpoint(dir, Contents(bytes, files, data), WriteOptions{}).status(), "write");
  data.clear();
  const std::string url = absl::StrCat("s3://", kBucket, "/ckpt");
  Die(CopyCheckpoint(dir, url).status(), "copy to s3");
  absl::StatusOr<pb::Manifest> manifest = ReadStoreManifest(url, absl::Now() + absl::Minutes(1));
  Die(manifest.status(), "manifest");
  std::vector<std::pair<std::string, int64_t>> objects;
  for (const pb::DataFile& f : manifest->files()) {
    objects.emplace_back(absl::StrCat("ckpt/", manifest->object_generation(), "/", f.name()),
                         f.size_bytes());
  }
  std::vector<std::string> out(std::max<size_t>(objects.size(), manifest->tensors_size()));
  std::printf("%.0f MiB in %d objects; %d GETs of %lld MiB in flight\n", bytes / 1048576.0, files,
              concurrency, static_cast<long long>(options.io.buffer_bytes >> 20));
  std::printf("run | path | seconds | GB/s | %% of limit\n");
  for (int r = 0; r < repeat; ++r) {
    const double limit =
        Seconds([&] { GetAll(*client, objects, options.io.buffer_bytes, concurrency, out); });
    const double s3 = Seconds([&] { ReadAll(url, options, out); });
    const double local = Seconds([&] { ReadAll(dir, options, out); });
    auto row = [&](const char* path, double s) {
      std::printf("%d | %s | %.3f | %.3f | %.0f%%\n", r, path, s, bytes / s / 1e9,
                  100.0 * limit / s);
    };
    row("S3Client ranged GETs (limit)", limit);
    row("CheckpointReader s3://", s3);
    row("CheckpointReader directory (page cache)", local);
  }
  Die(RemoveTree(root), "cleanup");
  return 0;
}

}  // namespace
}  // namespace ckpt

int main(int argc, char** argv) { return ckpt::Main(argc, argv); }
