// A CopyStream for the cpu device whose copies really run later than they are queued, so that the cpu
// tests see a missing wait as a GPU would (the cpu's default stream copies at once, and no wait can be
// missed there). Chosen by CopyStream::make on the cpu with ZSHARD_TEST_COPY_STREAM:
//
//   async[:SEED]  a thread of its own runs the queued copies in order, each after a random pause of up to
//                 1 ms (the pauses drawn from SEED, default 1): real concurrency with the host.
//   lazy          the copies run only when a wait needs them, on the waiting thread: the latest order a
//                 stream may take, deterministic, so that a missing wait reads stale data every time.
//
// The host is the cpu's compute stream: compute_waits blocks the host as host_waits does, and
// follow_compute has nothing to order. ZSHARD_TEST_COPY_STREAM_SKIP_WAIT=N makes each such stream's N-th
// wait (host_waits and compute_waits, counted from 1) return at once: how a test shows that the results
// depend on each wait.
#pragma once
#include <memory>
#include <string>

#include "kernels/copy_stream.h"

namespace zshard {

// The stream ZSHARD_TEST_COPY_STREAM asks for (kernels/test_hooks.h), null when that hook is off.
std::unique_ptr<CopyStream> make_test_copy_stream(int marks);

}  // namespace zshard
