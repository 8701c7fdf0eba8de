#include "common/allocator.h"

#include <cstddef>

// Defined only when jemalloc is linked (weak: null otherwise).
extern "C" int mallctl(const char* name, void* oldp, size_t* oldlenp, void* newp, size_t newlen)
    __attribute__((weak));

namespace ckpt {

std::string AllocatorName() {
  if (mallctl == nullptr) return "glibc";
  const char* version = nullptr;
  size_t length = sizeof(version);
  if (mallctl("version", &version, &length, nullptr, 0) != 0 || version == nullptr) {
    return "jemalloc";
  }
  return std::string("jemalloc ") + version;
}

}  // namespace ckpt
