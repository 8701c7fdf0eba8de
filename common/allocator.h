// Which malloc serves this process: "jemalloc <version>" when jemalloc is linked in
// (@system//:jemalloc, the coordinator), "glibc" otherwise. Daemons log it at start, so a
// memory figure can be read against the allocator that produced it.
#ifndef CKPT_COMMON_ALLOCATOR_H_
#define CKPT_COMMON_ALLOCATOR_H_

#include <string>

namespace ckpt {

// See the file comment.
std::string AllocatorName();

}  // namespace ckpt

#endif  // CKPT_COMMON_ALLOCATOR_H_
