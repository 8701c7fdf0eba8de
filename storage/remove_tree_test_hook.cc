#include "storage/remove_tree_test_hook.h"

#include <utility>

namespace ckpt {
namespace file_util_internal {
// Weak and empty in storage/file_util.cc, which calls it; defined again below.
void RemoveTreeListed(const std::string& dir);
}  // namespace file_util_internal

namespace {

std::function<void(const std::string&)>& InstalledHook() {
  static auto* hook = new std::function<void(const std::string&)>();
  return *hook;
}

}  // namespace

void SetRemoveTreeHookForTests(std::function<void(const std::string& dir)> hook) {
  InstalledHook() = std::move(hook);
}

namespace file_util_internal {

// Replaces the weak release definition in storage/file_util.cc.
void RemoveTreeListed(const std::string& dir) {
  if (InstalledHook()) InstalledHook()(dir);
}

}  // namespace file_util_internal
}  // namespace ckpt
