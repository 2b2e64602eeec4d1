// The authenticated handshake every Ember connection starts with (before any
// frame is read).  Mutual HMAC-SHA256 challenge-response over the per-job
// secret; the secret itself never crosses the wire.
//
//   server -> client: "EMBR" | u16 version (LE) | nonce_s[32]            (38 bytes)
//   client -> server: nonce_c[32] | HMAC(secret, "ember-client" | nonce_s | nonce_c)  (64 bytes)
//   server -> client: 0x01 | HMAC(secret, "ember-server" | nonce_c | nonce_s)   (33 bytes)
//                  or 0x00 and close, when the client's HMAC is wrong           (1 byte)
//
// Every read has a fixed size and runs under one deadline, so a silent or
// garbage-sending peer costs one thread for at most that long.  The verdict
// byte lets the client tell a wrong secret (Unauthenticated) from a server
// that went away mid-handshake (Unavailable).
#pragma once

#include <string>

#include "common/deadline.h"
#include "ember/status.h"

namespace ember::tcp {

inline constexpr char kHandshakeMagic[4] = {'E', 'M', 'B', 'R'};
inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kMacBytes = 32;
inline constexpr unsigned char kVerdictRejected = 0x00;
inline constexpr unsigned char kVerdictAccepted = 0x01;

// Server side.  Unauthenticated("bad HMAC") if the client does not prove
// the secret; DeadlineExceeded/Unavailable/IOError if it stalls or leaves.
// The caller logs and closes on failure (it knows the peer's name).
Status ServerHandshake(int fd, const std::string& secret, Deadline deadline,
                       const std::string& peer);

// Client side.  Unauthenticated if the server rejects our HMAC or its proof is
// wrong; Unavailable if the peer is not an Ember server (bad magic), speaks
// another protocol version, or closes the connection before its verdict.
Status ClientHandshake(int fd, const std::string& secret, Deadline deadline,
                       const std::string& peer);

}  // namespace ember::tcp
