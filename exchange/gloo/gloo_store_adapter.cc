#include "exchange/gloo/gloo_store_adapter.h"

#include <gloo/common/error.h>

#include <algorithm>

#include "absl/time/clock.h"

namespace ckpt {

void GlooStoreAdapter::set(const std::string& key, const std::vector<char>& data) {
  absl::Status s = store_->Set(key, absl::string_view(data.data(), data.size()), deadline_);
  if (!s.ok()) throw gloo::IoException(s.ToString());
}

std::vector<char> GlooStoreAdapter::get(const std::string& key) {
  auto values = store_->Get({key}, deadline_);
  if (!values.ok()) throw gloo::IoException(values.status().ToString());
  const std::string& v = (*values)[0];
  return std::vector<char>(v.begin(), v.end());
}

void GlooStoreAdapter::wait(const std::vector<std::string>& keys) {
  absl::Status s = store_->Wait(keys, deadline_);
  if (!s.ok()) throw gloo::IoException(s.ToString());
}

void GlooStoreAdapter::wait(const std::vector<std::string>& keys,
                            const std::chrono::milliseconds& timeout) {
  absl::Time deadline = deadline_;
  if (timeout.count() > 0) deadline = std::min(deadline, absl::Now() + absl::FromChrono(timeout));
  absl::Status s = store_->Wait(keys, deadline);
  if (!s.ok()) throw gloo::IoException(s.ToString());
}

}  // namespace ckpt
