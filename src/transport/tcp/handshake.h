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

#include <functional>
#include <string>
#include <string_view>

#include "ember/deadline.h"
#include "common/fd.h"
#include "ember/result.h"

namespace ember::tcp {

inline constexpr char kHandshakeMagic[4] = {'E', 'M', 'B', 'R'};
inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kMacBytes = 32;
inline constexpr unsigned char kVerdictRejected = 0x00;
inline constexpr unsigned char kVerdictAccepted = 0x01;

// Server side.  Unauthenticated("bad HMAC") if the client does not prove
// the secret; DeadlineExceeded/Unavailable/IOError if it stalls or leaves.
// The caller logs and closes on failure (it knows the peer's name).
// `verified`, if set, runs once the client proved the secret and before the
// server's verdict is sent; an error from it fails the handshake (the
// acceptor uses it to take the connection out of PendingHandshakes, so a
// connection is never dropped after the client was told it is accepted).
Status ServerHandshake(int fd, const std::string& secret, Deadline deadline,
                       const std::string& peer, const std::function<Status()>& verified = nullptr);

// Client side.  Unauthenticated if the server rejects our HMAC or its proof is
// wrong; Unavailable if the peer is not an Ember server (bad magic), speaks
// another protocol version, or closes the connection before its verdict.
Status ClientHandshake(int fd, const std::string& secret, Deadline deadline,
                       const std::string& peer);

// HMAC-SHA256(secret, label): a 32-byte key derived from the job's secret for
// a second kind of peer, so that a peer holding one key can never pass the
// other's handshake (the coordinator relay's agent port uses
// label "ember-relay-agent").  Internal if OpenSSL's HMAC fails.
Result<std::string> DeriveSecret(const std::string& secret, std::string_view label);

// Connects to host:port and runs the client handshake, all within
// `deadline`.  A server that closes the connection before its verdict (it
// dropped it to admit a newer one in a flood of unauthenticated connections,
// see pending.h) is dialled again after a short backoff, so a flood costs the
// job's client a retry, not its connection.  Errors: those of Connect()
// (nothing listening, host unreachable; *connect_failed set if given) or of
// ClientHandshake(); a connection closed in the handshake until the deadline
// is Unavailable and says so.
Result<Fd> Dial(const std::string& host, int port, const std::string& secret, Deadline deadline,
                const std::string& peer, bool* connect_failed = nullptr);

}  // namespace ember::tcp
