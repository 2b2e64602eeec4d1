// Threads that each serve one connection or tunnel, kept in a list of entries that own them: an
// entry's thread sets its `finished` flag as its last act, and its owner reaps such entries from
// time to time (the acceptor's connections, the relay agent's tunnels).
//
//   std::vector<std::unique_ptr<Entry>> done;
//   {
//     MutexLock lock(&mu_);
//     done = TakeFinished(entries_);  // under the lock that guards the list
//   }
//   JoinAll(done);                    // outside it: a finishing thread may still take it
#pragma once

#include <list>
#include <memory>
#include <vector>

namespace ember {

// Moves the entries of `live` whose thread finished out of it (in order).
template <typename Entry>
std::vector<std::unique_ptr<Entry>> TakeFinished(std::list<std::unique_ptr<Entry>>& live) {
  std::vector<std::unique_ptr<Entry>> done;
  for (auto it = live.begin(); it != live.end();) {
    if ((*it)->finished.load()) {
      done.push_back(std::move(*it));
      it = live.erase(it);
    } else {
      ++it;
    }
  }
  return done;
}

// Joins the threads of `entries` (each has finished, or is about to).
template <typename Entry>
void JoinAll(std::vector<std::unique_ptr<Entry>>& entries) {
  for (auto& e : entries) e->thread.join();
}

}  // namespace ember
