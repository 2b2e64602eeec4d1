// The parameter server's frame types on the job's TCP transport (transport/tcp/frame.h):
// a worker sends kRequestFrame (payload: ps/codec.h's request), the shard answers with one
// kReplyFrame (its reply).  Any other type drops the connection.
#pragma once

#include <cstdint>

namespace ember::ps {

inline constexpr uint16_t kRequestFrame = 1;
inline constexpr uint16_t kReplyFrame = 2;

}  // namespace ember::ps
