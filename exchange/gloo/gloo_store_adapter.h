// Presents a ckpt::Store as a gloo::rendezvous::Store for Gloo's connectFullMesh. Gloo expects
// errors as exceptions, so failures are thrown as gloo::IoException; the Gloo backend catches
// them (they never leave exchange/gloo).
#ifndef CKPT_EXCHANGE_GLOO_GLOO_STORE_ADAPTER_H_
#define CKPT_EXCHANGE_GLOO_GLOO_STORE_ADAPTER_H_

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "rendezvous/store.h"

namespace ckpt {

// Every operation is bounded by the adapter's deadline (and Gloo's own timeout, if earlier).
class GlooStoreAdapter : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(ckpt::Store* store, absl::Time deadline) : store_(store), deadline_(deadline) {}

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  ckpt::Store* store_;
  absl::Time deadline_;
};

}  // namespace ckpt

#endif  // CKPT_EXCHANGE_GLOO_GLOO_STORE_ADAPTER_H_
