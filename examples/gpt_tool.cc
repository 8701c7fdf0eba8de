// gpt_tool: command-line access to the example GPT state for demos and scripts.
//
//   gpt_tool layout --tp 2 --dp 2 [--no-flat]            print the Megatron-style layout JSON
//   gpt_tool write <ckpt> (--layout FILE | --tp N --dp N) [--size-mb N | --layers N --hidden N
//                  --vocab N] [--step N] [--overwrite]  save the state in that layout
//   gpt_tool check <ckpt> --layout FILE                  read back every piece of the layout and
//                                                        compare every element
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "examples/gpt_checkpoint.h"
#include "examples/gpt_state.h"
#include "planner/layout_spec.h"
#include "storage/checkpoint_reader.h"
#include "storage/manifest_codec.h"

namespace ckpt {
namespace {

constexpr char kUsage[] =
    "usage: gpt_tool layout --tp N --dp N [--no-flat]\n"
    "       gpt_tool write <ckpt> (--layout FILE | --tp N --dp N) [--size-mb N | --layers N\n"
    "                      --hidden N --vocab N] [--step N] [--overwrite]\n"
    "       gpt_tool check <ckpt> --layout FILE\n";

int Fail(const std::string& msg) {
  std::fprintf(stderr, "gpt_tool: %s\n", msg.c_str());
  return 1;
}

struct Args {
  std::vector<std::string> positional;
  std::map<std::string, std::string> flags;
};

bool Parse(int argc, char** argv, Args* out, std::string* error) {
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--", 0) != 0) {
      out->positional.push_back(a);
    } else if (a == "--no-flat" || a == "--overwrite" || a == "--help") {
      out->flags[a.substr(2)] = "1";
    } else if (i + 1 < argc) {
      out->flags[a.substr(2)] = argv[++i];
    } else {
      *error = a + " needs a value";
      return false;
    }
  }
  return true;
}

bool Int(const Args& args, const std::string& name, int64_t* value) {
  auto it = args.flags.find(name);
  if (it == args.flags.end()) return true;
  return absl::SimpleAtoi(it->second, value) && *value >= 0;
}

absl::StatusOr<LayoutSpec> LayoutFrom(const Args& args) {
  if (args.flags.count("layout")) return LayoutSpec::FromFile(args.flags.at("layout"));
  int64_t tp = 0, dp = 0;
  if (!Int(args, "tp", &tp) || !Int(args, "dp", &dp) || tp < 1 || dp < 1) {
    return absl::InvalidArgumentError("give --layout FILE or --tp N --dp N (N >= 1)");
  }
  return LayoutSpec::Parse(GptLayoutJson(tp, dp, !args.flags.count("no-flat")));
}

int Main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help") {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string cmd = argv[1];
  Args args;
  std::string error;
  if (!Parse(argc, argv, &args, &error)) return Fail(error);
  if (args.flags.count("help")) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (cmd == "layout") {
    int64_t tp = 0, dp = 0;
    if (!Int(args, "tp", &tp) || !Int(args, "dp", &dp) || tp < 1 || dp < 1) {
      return Fail("layout needs --tp N --dp N (N >= 1)");
    }
    std::fputs(GptLayoutJson(tp, dp, !args.flags.count("no-flat")).c_str(), stdout);
    return 0;
  }
  if (args.positional.size() != 1) return Fail(cmd + " needs one checkpoint path");
  const std::string path = args.positional[0];
  absl::StatusOr<LayoutSpec> layout = LayoutFrom(args);
  if (!layout.ok()) return Fail(std::string(layout.status().message()));
  const auto t0 = std::chrono::steady_clock::now();
  auto seconds = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };

  if (cmd == "write") {
    GptConfig config;
    int64_t size_mb = 0, step = 0;
    if (!Int(args, "size-mb", &size_mb) || !Int(args, "layers", &config.layers) ||
        !Int(args, "hidden", &config.hidden) || !Int(args, "vocab", &config.vocab) ||
        !Int(args, "step", &step)) {
      return Fail("bad numeric option");
    }
    if (size_mb > 0) config = GptConfigForBytes(size_mb << 20);
    absl::StatusOr<std::vector<TensorMeta>> tensors = GptTensors(config);
    if (!tensors.ok()) return Fail(std::string(tensors.status().message()));
    WriteOptions options;
    options.overwrite = args.flags.count("overwrite") > 0;
    absl::StatusOr<WaveWriteStats> stats = WriteGptCheckpoint(
        path, *tensors, *layout, int64_t{256} << 20, options, step,
        {{"example", "gpt"},
         {"gpt_config", absl::StrCat("layers=", config.layers, " hidden=", config.hidden,
                                     " vocab=", config.vocab)}});
    if (!stats.ok()) return Fail(std::string(stats.status().message()));
    const double s = seconds();
    std::printf("wrote %s: %zu tensors, %lld bytes, %lld files, %.2f s, %.2f GB/s\n", path.c_str(),
                tensors->size(), static_cast<long long>(stats->bytes_written),
                static_cast<long long>(stats->files), s, stats->bytes_written / s / 1e9);
    return 0;
  }
  if (cmd == "check") {
    // The tensors come from the checkpoint itself.
    absl::StatusOr<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(path);
    if (!reader.ok()) return Fail(std::string(reader.status().message()));
    std::vector<TensorMeta> tensors;
    for (const pb::TensorMeta& t : (*reader)->manifest().tensors()) {
      absl::StatusOr<DType> dtype = DTypeFromProto(t.dtype());
      if (!dtype.ok()) return Fail(std::string(dtype.status().message()));
      tensors.push_back(
          TensorMeta{t.key(), *dtype, {t.global_shape().begin(), t.global_shape().end()}});
    }
    absl::StatusOr<GptCheckReport> report = CheckGptCheckpoint(path, tensors, *layout);
    if (!report.ok()) return Fail(std::string(report.status().message()));
    std::printf("ok %s: %lld pieces, %lld elements, %lld bytes checked in %.2f s\n", path.c_str(),
                static_cast<long long>(report->regions), static_cast<long long>(report->elements),
                static_cast<long long>(report->bytes), seconds());
    return 0;
  }
  return Fail("unknown command \"" + cmd + "\" (layout, write, check)");
}

}  // namespace
}  // namespace ckpt

int main(int argc, char** argv) { return ckpt::Main(argc, argv); }
