#include "tools/ckptctl/plan_io.h"

#include <fcntl.h>
#include <malloc.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ckpt::ckptctl {
namespace {

// A mapped input file truncated by someone else while it is read raises SIGBUS on the first
// access past its new end: end with a message instead of a crash. Nothing has been written
// yet (output is written after the whole input is read).
void OnInputTruncated(int) {
  static constexpr char kMessage[] =
      "ckptctl plan: the input file was truncated while it was read; nothing was written\n";
  ssize_t ignored = ::write(STDERR_FILENO, kMessage, sizeof(kMessage) - 1);
  (void)ignored;
  ::_exit(1);
}

void CatchTruncation() {
  struct sigaction action;
  std::memset(&action, 0, sizeof(action));
  action.sa_handler = OnInputTruncated;
  sigemptyset(&action.sa_mask);
  ::sigaction(SIGBUS, &action, nullptr);
}

}  // namespace

void UseHugePagesForLargeArrays(size_t input_bytes) {
  constexpr size_t kHugePage = size_t{2} << 20;
  const size_t region = std::min<size_t>(3 * input_bytes + 32 * kHugePage, size_t{1} << 30);
  // Chunks up to 32 MiB (glibc's largest threshold) from the heap rather than each its own
  // mmap outside the region; the heap grows by the whole region at once (untouched pages
  // cost nothing) and is kept when chunks are freed.
  if (mallopt(M_MMAP_THRESHOLD, 32 << 20) == 0 || mallopt(M_TRIM_THRESHOLD, -1) == 0 ||
      mallopt(M_TOP_PAD, static_cast<int>(region)) == 0) {
    return;
  }
  void* block = std::malloc(kHugePage);  // more than the heap has left: it grows now
  if (block == nullptr) return;
  const uintptr_t start = (reinterpret_cast<uintptr_t>(block) + kHugePage - 1) & ~(kHugePage - 1);
  const uintptr_t end = reinterpret_cast<uintptr_t>(::sbrk(0)) & ~(kHugePage - 1);
  if (end > start) ::madvise(reinterpret_cast<void*>(start), end - start, MADV_HUGEPAGE);
  std::free(block);
}

PlanInput::PlanInput(PlanInput&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      mapping_(std::exchange(other.mapping_, nullptr)),
      buffer_(std::move(other.buffer_)),
      capacity_(std::exchange(other.capacity_, 0)) {}

PlanInput::~PlanInput() {
  if (mapping_ != nullptr) ::munmap(mapping_, size_);
}

ssize_t PlanInput::ReadFrom(int fd, size_t n) {
  if (size_ + n > capacity_) {
    const size_t capacity = std::max(size_ + n, capacity_ * 2);
    std::unique_ptr<char[]> grown(new char[capacity]);
    if (size_ > 0) std::memcpy(grown.get(), buffer_.get(), size_);
    buffer_ = std::move(grown);
    capacity_ = capacity;
  }
  const ssize_t got = ::read(fd, buffer_.get() + size_, n);
  if (got > 0) size_ += static_cast<size_t>(got);
  data_ = buffer_.get();
  return got;
}

absl::StatusOr<PlanInput> ReadPlanInput(const std::optional<std::string>& path) {
  int fd = STDIN_FILENO;
  if (path) {
    fd = ::open(path->c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      return absl::NotFoundError(
          absl::StrCat("cannot open input file ", *path, ": ", std::strerror(errno)));
    }
  }
  PlanInput input;
  struct stat st;
  const bool stat_ok = ::fstat(fd, &st) == 0;
  if (path && stat_ok && S_ISDIR(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat("input ", *path, " is a directory; give a JSON Lines file"));
  }
  if (stat_ok && S_ISREG(st.st_mode) && st.st_size > 0) {
    CatchTruncation();
    const size_t size = static_cast<size_t>(st.st_size);
    void* mapping = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
    if (mapping != MAP_FAILED) {
      if (path) ::close(fd);
      input.mapping_ = mapping;
      input.data_ = static_cast<const char*>(mapping);
      input.size_ = size;
      return input;
    }
  }
  // A pipe, or a file that cannot be mapped: read in chunks (a regular file's size at once).
  size_t chunk = stat_ok && S_ISREG(st.st_mode) && st.st_size > 0
                     ? static_cast<size_t>(st.st_size) + 1
                     : size_t{1} << 16;
  while (true) {
    const ssize_t n = input.ReadFrom(fd, chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error = n < 0 ? errno : 0;
      if (path) ::close(fd);
      if (error != 0) {
        return absl::UnavailableError(
            absl::StrCat("cannot read ", path ? *path : "stdin", ": ", std::strerror(error)));
      }
      return input;
    }
    chunk = size_t{1} << 16;
  }
}

absl::Status WritePlanOutput(const std::optional<std::string>& path, absl::string_view text) {
  if (!path) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    if (std::fflush(stdout) != 0) return absl::UnavailableError("cannot write to stdout");
    return absl::OkStatus();
  }
  const std::string tmp = *path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("cannot write ", tmp, ": ", std::strerror(errno)));
  }
  size_t written = 0;
  while (written < text.size()) {
    const ssize_t n = ::write(fd, text.data() + written, text.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    written += static_cast<size_t>(n);
  }
  const int write_error = written == text.size() ? 0 : (errno != 0 ? errno : EIO);
  if (::close(fd) != 0 || write_error != 0) {
    std::remove(tmp.c_str());
    return absl::UnavailableError(absl::StrCat(
        "cannot write ", tmp, ": ", std::strerror(write_error != 0 ? write_error : errno)));
  }
  if (std::rename(tmp.c_str(), path->c_str()) != 0) {
    std::remove(tmp.c_str());
    return absl::UnavailableError(absl::StrCat("cannot rename ", tmp, " to ", *path));
  }
  return absl::OkStatus();
}

}  // namespace ckpt::ckptctl
