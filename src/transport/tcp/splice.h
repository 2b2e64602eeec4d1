// tcp::Splice: joins two connected sockets into one pipe, copying bytes both
// ways on the calling thread until either side closes or fails.  The
// coordinator relay (coordinator/relay.cc) runs one per tunnel on each side:
// node <-> relay <-> agent <-> coordinator.
//
// One poll(2) over both non-blocking sockets and a bounded buffer per
// direction: a direction reads only while its buffer has room and writes
// (POLLOUT) only while it holds bytes, so a slow reader on one side holds back
// only its own direction, and no write ever blocks while the other direction
// has bytes to move (no deadlock however full both directions are).
//
// When a side closes (EOF), the bytes it sent before closing are flushed to
// the other side (within drain_timeout), then Splice returns; the caller then
// shuts both sockets down, so the other side sees the close too.  Splice
// never shuts down or closes the descriptors itself.  To stop a running
// Splice from another thread, shutdown(2) either socket: it then reads EOF or
// fails a write, and returns.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "ember/deadline.h"
#include "ember/status.h"

namespace ember::tcp {

struct SpliceOptions {
  size_t buffer_bytes = 64 << 10;  // per direction
  // After a side closed: how long the other side has to take the last bytes.
  Duration drain_timeout{5000};
};

struct SpliceResult {
  uint64_t a_to_b = 0;  // bytes written to b that came from a
  uint64_t b_to_a = 0;
  // OK when a side closed its connection (closed_by names it: a_name or
  // b_name); otherwise IOError naming the side and the call that failed, or
  // DeadlineExceeded when the last bytes could not be flushed within
  // drain_timeout.
  Status status;
  std::string closed_by;
};

// Copies bytes between the connected, non-blocking sockets `a` and `b` until
// either side closes or fails (see above).  `a_name`/`b_name` name the sides
// in the result ("node 10.0.0.5:4711").  Thread-compatible: one Splice per
// pair of sockets; other threads may only shutdown(2) them.
SpliceResult Splice(int a, int b, const std::string& a_name, const std::string& b_name,
                    const SpliceOptions& options = {});

}  // namespace ember::tcp
