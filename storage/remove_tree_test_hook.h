// Test seam of RemoveTree (storage/file_util.h), testonly: a function run with each
// directory's path after RemoveTree has listed the directory and before it removes the entries,
// so a test can swap something in the tree at that moment, deterministically. Linking this
// target replaces RemoveTree's weak, empty file_util_internal::RemoveTreeListed at link time;
// the release RemoveTree tests no hook.
#ifndef CKPT_STORAGE_REMOVE_TREE_TEST_HOOK_H_
#define CKPT_STORAGE_REMOVE_TREE_TEST_HOOK_H_

#include <functional>
#include <string>
#include <utility>

namespace ckpt {

// Installs `hook` (an empty function removes it). Not thread-safe: set it while no RemoveTree
// runs.
void SetRemoveTreeHookForTests(std::function<void(const std::string& dir)> hook);

// Installs a hook for its lifetime.
class ScopedRemoveTreeHook {
 public:
  explicit ScopedRemoveTreeHook(std::function<void(const std::string& dir)> hook) {
    SetRemoveTreeHookForTests(std::move(hook));
  }
  ~ScopedRemoveTreeHook() { SetRemoveTreeHookForTests(nullptr); }
  ScopedRemoveTreeHook(const ScopedRemoveTreeHook&) = delete;
  ScopedRemoveTreeHook& operator=(const ScopedRemoveTreeHook&) = delete;
};

}  // namespace ckpt

#endif  // CKPT_STORAGE_REMOVE_TREE_TEST_HOOK_H_
