// Test driver for fuzz targets built without libFuzzer: feeds every corpus file named on the
// command line to LLVMFuzzerTestOneInput, then CKPT_FUZZ_REPLAY_MUTATIONS (default 2000)
// fixed-seed mutations of them (byte flips, truncations, insertions, splices of two inputs).
// A crash or sanitizer report fails the test; the mutation's number and seed are printed first
// so a failure can be reproduced.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

std::string ReadFile(const char* path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void Run(const std::string& input) {
  // A copy in its own allocation, so AddressSanitizer sees reads past the end.
  std::vector<uint8_t> bytes(input.begin(), input.end());
  LLVMFuzzerTestOneInput(bytes.empty() ? nullptr : bytes.data(), bytes.size());
}

std::string Mutate(const std::vector<std::string>& corpus, std::mt19937_64& rng) {
  std::string s = corpus[rng() % corpus.size()];
  const int edits = 1 + static_cast<int>(rng() % 4);
  for (int e = 0; e < edits; ++e) {
    switch (rng() % 5) {
      case 0:  // flip a byte
        if (!s.empty()) s[rng() % s.size()] ^= static_cast<char>(1 + rng() % 255);
        break;
      case 1:  // truncate
        s.resize(s.empty() ? 0 : rng() % s.size());
        break;
      case 2: {  // insert a byte that parsers care about
        static constexpr char kSyntax[] = {'{', '}', '[', ']', '"',  ',',  ':',    '0',
                                           '9', '-', 'e', '.', '\\', '\n', '\xff', '\0'};
        s.insert(s.empty() ? 0 : rng() % s.size(), 1, kSyntax[rng() % sizeof(kSyntax)]);
        break;
      }
      case 3: {  // splice with another input
        const std::string& other = corpus[rng() % corpus.size()];
        const size_t cut = s.empty() ? 0 : rng() % s.size();
        const size_t from = other.empty() ? 0 : rng() % other.size();
        s = s.substr(0, cut) + other.substr(from);
        break;
      }
      default:  // duplicate a span (deep nesting, repeated keys)
        if (!s.empty()) {
          const size_t at = rng() % s.size();
          const size_t len = 1 + rng() % std::min<size_t>(64, s.size() - at);
          s.insert(at, s.substr(at, len));
        }
    }
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> corpus;
  for (int i = 1; i < argc; ++i) {
    corpus.push_back(ReadFile(argv[i]));
    std::fprintf(stderr, "replay %s (%zu bytes)\n", argv[i], corpus.back().size());
    Run(corpus.back());
  }
  if (corpus.empty()) {
    std::fprintf(stderr, "no corpus files given: a fuzz target needs a seed corpus\n");
    return 1;
  }
  const char* env = std::getenv("CKPT_FUZZ_REPLAY_MUTATIONS");
  const int mutations = env != nullptr ? std::atoi(env) : 2000;
  std::mt19937_64 rng(20261123);
  for (int m = 0; m < mutations; ++m) Run(Mutate(corpus, rng));
  std::fprintf(stderr, "%zu corpus inputs and %d mutations ran cleanly\n", corpus.size(),
               mutations);
  return 0;
}
