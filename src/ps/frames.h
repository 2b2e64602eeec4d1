// The parameter server's frame types on the job's TCP transport (transport/tcp/frame.h):
// a worker sends kRequestFrame (payload: ps/codec.h's request), the shard answers with one
// kReplyFrame (its reply).  A worker on the shard's host may first offer shared memory
// (kShmOfferFrame, answered by kShmAnswerFrame: ps/codec.h); then requests and replies go
// through two rings (ps/shm_link.h), the socket staying for liveness and oversize messages.
// Any other type drops the connection.
#pragma once

#include <cstdint>

namespace ember::ps {

inline constexpr uint16_t kRequestFrame = 1;
inline constexpr uint16_t kReplyFrame = 2;
inline constexpr uint16_t kShmOfferFrame = 3;
inline constexpr uint16_t kShmAnswerFrame = 4;

}  // namespace ember::ps
