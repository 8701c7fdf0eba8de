// Test helper (testonly): the coordinator's Rendezvous service over its own KvStore, served on
// an ephemeral loopback port, for tests whose ranks (threads or processes) join through it.
#ifndef CKPT_RENDEZVOUS_LOOPBACK_RENDEZVOUS_H_
#define CKPT_RENDEZVOUS_LOOPBACK_RENDEZVOUS_H_

#include <memory>
#include <string>

#include "rendezvous/kv_store.h"
#include "rendezvous/rendezvous_service.h"

namespace grpc {
class Server;
}  // namespace grpc

namespace ckpt {

// Starts serving on construction (check ok()); shuts the server down on destruction.
class LoopbackRendezvous {
 public:
  LoopbackRendezvous();
  ~LoopbackRendezvous();
  LoopbackRendezvous(const LoopbackRendezvous&) = delete;
  LoopbackRendezvous& operator=(const LoopbackRendezvous&) = delete;

  bool ok() const { return server_ != nullptr; }
  int port() const { return port_; }
  std::string address() const;  // "127.0.0.1:<port>"

 private:
  KvStore kv_;
  RendezvousService service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace ckpt

#endif  // CKPT_RENDEZVOUS_LOOPBACK_RENDEZVOUS_H_
