#include "rendezvous/loopback_rendezvous.h"

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace ckpt {

LoopbackRendezvous::LoopbackRendezvous() : service_(&kv_) {
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
  builder.RegisterService(&service_);
  server_ = builder.BuildAndStart();
}

LoopbackRendezvous::~LoopbackRendezvous() {
  if (server_ != nullptr) server_->Shutdown(absl::ToChronoTime(absl::Now()));
}

std::string LoopbackRendezvous::address() const { return absl::StrCat("127.0.0.1:", port_); }

}  // namespace ckpt
