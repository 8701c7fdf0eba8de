#include "storage/remove_tree_test_hook.h"

#include <utility>

namespace ckpt {
namespace file_util_internal {
// Defined in storage/file_util.cc, null there; declared only here.
extern void (*remove_tree_listed_hook)(const std::string& dir);
}  // namespace file_util_internal

namespace {

std::function<void(const std::string&)>& InstalledHook() {
  static auto* hook = new std::function<void(const std::string&)>();
  return *hook;
}

void CallInstalledHook(const std::string& dir) { InstalledHook()(dir); }

}  // namespace

void SetRemoveTreeHookForTests(std::function<void(const std::string& dir)> hook) {
  const bool set = static_cast<bool>(hook);
  InstalledHook() = std::move(hook);
  file_util_internal::remove_tree_listed_hook = set ? &CallInstalledHook : nullptr;
}

}  // namespace ckpt
