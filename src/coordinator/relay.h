// What the coordinator relay (relay.cc) and its agent (relay_agent.cc) share.
// The public API is in ember/coordinator.h; the messages in coordinator/codec.h.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "ember/result.h"
#include "transport/tcp/handshake.h"

namespace ember::coord {

// The agent port's key is HMAC-SHA256(job secret, this label): a node, which
// holds the job's secret, cannot pass the agent port's handshake, nor an agent
// the node port's.
inline constexpr std::string_view kRelayAgentLabel = "ember-relay-agent";

inline Result<std::string> RelayAgentSecret(const std::string& secret) {
  return tcp::DeriveSecret(secret, kRelayAgentLabel);
}

// The largest frame either side reads from the other: RelayControl, RelayData,
// RelayOpen and Heartbeat are a few bytes each.
inline constexpr size_t kMaxRelayFrameBytes = 64;

}  // namespace ember::coord
