// Host-memory Communicator over Gloo's TCP transport (Debian's libgloo). Every collective is
// built from Gloo unbound-buffer sends/receives with one buffer per peer, so a failure can be
// attributed to the peer rank; every Gloo exception is caught here and becomes a Status.
#ifndef CKPT_EXCHANGE_GLOO_GLOO_COMMUNICATOR_H_
#define CKPT_EXCHANGE_GLOO_GLOO_COMMUNICATOR_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "exchange/communicator.h"
#include "rendezvous/store.h"

namespace ckpt {

// How a Gloo group forms.
struct GlooOptions {
  // Address this rank's TCP device binds to and advertises to peers.
  std::string hostname = "127.0.0.1";
  // Store key prefix for this group. Must be unique per group instance (include a job or
  // generation id) because rendezvous keys stay in the store.
  std::string group_name = "gloo";
  // Added to the nice value of the thread that runs the TCP device's event loop (clamped to
  // 19; 0 leaves it alone). Gloo's loop thread busy-polls a socket whose pair lock another
  // thread holds (it try-locks and returns to epoll_wait, which reports the same level-triggered
  // event at once). When ranks outnumber cores, that spinning takes the core from the very
  // thread holding the lock, stalling each exchange by up to a scheduler tick. A lower priority
  // lets the lock holder run first; when nothing else wants the core the loop runs as before.
  // It also yields to other busy processes sharing the cores: set 0 where the data plane must
  // win against them.
  int loop_thread_nice = 10;
};

// Joins the group: every rank of 0..size-1 calls this with the same store and group name.
// Returns DeadlineExceeded naming the ranks that never arrived when the group does not form by
// `deadline`. Returns only after every rank has connected its whole mesh (a barrier closes the
// rendezvous), so a rank that fails and leaves right after creation makes its peers' next call
// fail naming it, never their creation.
//
// Gloo writes to sockets with writev, which raises SIGPIPE once a peer has closed; its default
// action kills the whole process, so one rank that dies would take every healthy peer process
// down with it. This call therefore sets SIGPIPE to SIG_IGN when its disposition is still the
// default (SIG_DFL); a handler the program installed is left alone. Writes to a closed peer then
// fail with EPIPE, which becomes Unavailable naming that peer.
absl::StatusOr<std::unique_ptr<Communicator>> CreateGlooCommunicator(Store* store, int rank,
                                                                     int size,
                                                                     const GlooOptions& options,
                                                                     absl::Time deadline);

}  // namespace ckpt

#endif  // CKPT_EXCHANGE_GLOO_GLOO_COMMUNICATOR_H_
