// The coordinator key/value store's key namespace, as far as C++ builds keys:
// one function per key, so a key's spelling lives in one place.  docs/wire.md
// ("Key/value namespace") lists every key a job uses, the Python layer's too
// (python/ember/_names.py and the modules named there).
//
// The store itself gives keys no meaning: any string, set once or
// overwritten, read by KvGet (nodes) or KvGet/WaitForKey (driver).  Keys are
// '/'-separated paths; Ember's own start with "ember/" or with a
// communicator's prefix, so user code should keep to other first segments.
#pragma once

#include <string>
#include <string_view>

namespace ember::kv {

// A communicator's meeting (src/collective/communicator.cc), under its
// options.prefix ("ember-<job id>-c0" for ctx.communicator()):
// rank r's card (host, name, pid), written by every rank first.
inline std::string CollectiveRankKey(std::string_view prefix, int rank) {
  return std::string(prefix) + "/rank/" + std::to_string(rank);
}
// The shared-memory segment's name of the host group led by `leader`,
// written by the leader once the segment exists.
inline std::string CollectiveShmKey(std::string_view prefix, int leader) {
  return std::string(prefix) + "/shm/" + std::to_string(leader);
}
// The decimal port of rank r's TCP ring listener, written by every ring member.
inline std::string CollectivePortKey(std::string_view prefix, int rank) {
  return std::string(prefix) + "/port/" + std::to_string(rank);
}

}  // namespace ember::kv
