// The node start-up message: what a launcher hands the node process it
// starts (docs/wire.md, "Node start-up").  Typed and versioned so that any
// executable can be a node; the one opaque field, `payload`, carries a Python
// node's cloudpickled user code.
//
// Layout (codec.h encodings):
//   4 bytes magic "EMBN" | u16 version (kStartupVersion) | fields of NodeContext
//   in declaration order; the cluster spec as u32 role count, then per role
//   (roles in strictly increasing byte order) string role | u32 n | n strings,
//   followed by i32 training_rank (-1: none) | i32 training_size, which the
//   encoder derives from the spec (ember/roles.h) and the decoder checks.
// The decoder reads bytes from another process and is fuzzed
// (node_startup_fuzz.cc): anything that decodes re-encodes to the same bytes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "ember/node.h"
#include "ember/result.h"

namespace ember::node {

inline constexpr char kStartupMagic[4] = {'E', 'M', 'B', 'N'};
inline constexpr uint16_t kStartupVersion = 4;  // 2: hdfs_http_address; 3: training rank/size, bind_host; 4: gpus

// EncodeStartup and DecodeStartup are declared in ember/node.h (the launcher
// writes the message through the bindings).

}  // namespace ember::node
