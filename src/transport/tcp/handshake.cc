#include "transport/tcp/handshake.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <array>
#include <cstring>
#include <string_view>
#include <thread>

#include "common/codec.h"
#include "transport/tcp/frame.h"
#include "transport/tcp/socket.h"

namespace ember::tcp {
namespace {

using Nonce = std::array<unsigned char, kNonceBytes>;
using Mac = std::array<unsigned char, kMacBytes>;

constexpr std::string_view kClientLabel = "ember-client";
constexpr std::string_view kServerLabel = "ember-server";

Status RandomNonce(Nonce* out) {
  if (RAND_bytes(out->data(), static_cast<int>(out->size())) != 1) {
    return Status::Internal("RAND_bytes failed: the OpenSSL CSPRNG is unavailable");
  }
  return Status::OK();
}

// HMAC-SHA256(secret, msg).
Status Hmac(const std::string& secret, std::string_view msg, Mac* out) {
  unsigned int len = 0;
  if (HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
           reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), out->data(),
           &len) == nullptr ||
      len != kMacBytes) {
    return Status::Internal("HMAC-SHA256 failed");
  }
  return Status::OK();
}

// HMAC-SHA256(secret, label | first | second).
Status ComputeMac(const std::string& secret, std::string_view label, const Nonce& first,
                  const Nonce& second, Mac* out) {
  std::string msg(label);
  msg.append(reinterpret_cast<const char*>(first.data()), first.size());
  msg.append(reinterpret_cast<const char*>(second.data()), second.size());
  return Hmac(secret, msg, out);
}

}  // namespace

Status ServerHandshake(int fd, const std::string& secret, Deadline deadline,
                       const std::string& peer, const std::function<Status()>& verified) {
  Nonce nonce_s;
  EMBER_RETURN_NOT_OK(RandomNonce(&nonce_s));
  codec::Writer hello;
  hello.PutRaw(std::string_view(kHandshakeMagic, sizeof(kHandshakeMagic)));
  hello.PutU16(kProtocolVersion);
  hello.PutRaw(std::string_view(reinterpret_cast<const char*>(nonce_s.data()), nonce_s.size()));
  EMBER_RETURN_NOT_OK(
      WriteAll(fd, hello.data().data(), hello.data().size(), deadline, "handshake to " + peer));

  unsigned char reply[kNonceBytes + kMacBytes];
  Status read = ReadExactly(fd, reply, sizeof(reply), deadline, "handshake from " + peer);
  if (read.code() == StatusCode::kDeadlineExceeded) {
    return Status::DeadlineExceeded("did not complete the handshake in time");
  }
  EMBER_RETURN_NOT_OK(read);
  Nonce nonce_c;
  std::memcpy(nonce_c.data(), reply, kNonceBytes);
  Mac expected;
  EMBER_RETURN_NOT_OK(ComputeMac(secret, kClientLabel, nonce_s, nonce_c, &expected));
  if (CRYPTO_memcmp(expected.data(), reply + kNonceBytes, kMacBytes) != 0) {
    // One constant byte says "rejected", so the client can tell a wrong secret
    // from a server that went away mid-handshake.  It tells an attacker nothing
    // the closed connection would not.
    const unsigned char verdict = kVerdictRejected;
    (void)WriteAll(fd, &verdict, 1, deadline, "handshake to " + peer);
    return Status::Unauthenticated("bad HMAC");
  }
  if (verified) EMBER_RETURN_NOT_OK(verified());
  unsigned char accept[1 + kMacBytes];
  accept[0] = kVerdictAccepted;
  Mac proof;
  EMBER_RETURN_NOT_OK(ComputeMac(secret, kServerLabel, nonce_c, nonce_s, &proof));
  std::memcpy(accept + 1, proof.data(), kMacBytes);
  return WriteAll(fd, accept, sizeof(accept), deadline, "handshake to " + peer);
}

namespace {

// ClientHandshake; *closed says the server closed (or reset) the connection
// before its verdict, the one failure worth dialling again for.
Status ClientHandshakeImpl(int fd, const std::string& secret, Deadline deadline, const std::string& peer,
                           bool* closed) {
  *closed = false;
  unsigned char hello[sizeof(kHandshakeMagic) + 2 + kNonceBytes];
  Status got_hello = ReadExactly(fd, hello, sizeof(hello), deadline, "handshake from " + peer);
  if (got_hello.code() == StatusCode::kUnavailable || got_hello.code() == StatusCode::kIOError) {
    *closed = true;
    return Status::Unavailable(peer + " closed the connection before its handshake greeting (it is shutting "
                               "down, or dropping pending handshakes in a flood of unauthenticated "
                               "connections): " + got_hello.message());
  }
  EMBER_RETURN_NOT_OK(got_hello);
  if (std::memcmp(hello, kHandshakeMagic, sizeof(kHandshakeMagic)) != 0) {
    return Status::Unavailable(peer + " is not an Ember server (bad handshake magic)");
  }
  codec::Reader r(std::string_view(reinterpret_cast<const char*>(hello) + 4, 2));
  uint16_t version = 0;
  EMBER_RETURN_NOT_OK(r.GetU16(&version));
  if (version != kProtocolVersion) {
    return Status::Unavailable(peer + " speaks Ember protocol version " + std::to_string(version) +
                               "; this build speaks version " + std::to_string(kProtocolVersion) +
                               " (driver and executors must run the same Ember version)");
  }
  Nonce nonce_s, nonce_c;
  std::memcpy(nonce_s.data(), hello + 6, kNonceBytes);
  EMBER_RETURN_NOT_OK(RandomNonce(&nonce_c));
  Mac mac;
  EMBER_RETURN_NOT_OK(ComputeMac(secret, kClientLabel, nonce_s, nonce_c, &mac));
  unsigned char reply[kNonceBytes + kMacBytes];
  std::memcpy(reply, nonce_c.data(), kNonceBytes);
  std::memcpy(reply + kNonceBytes, mac.data(), kMacBytes);
  Status sent = WriteAll(fd, reply, sizeof(reply), deadline, "handshake to " + peer);
  unsigned char verdict = 0;
  Status read = sent.ok() ? ReadExactly(fd, &verdict, 1, deadline, "handshake from " + peer) : sent;
  if (read.code() == StatusCode::kUnavailable || read.code() == StatusCode::kIOError) {
    *closed = true;
    return Status::Unavailable(peer + " closed the connection during the handshake (it is shutting down, or "
                               "dropping pending handshakes in a flood of unauthenticated connections): " +
                               read.message());
  }
  EMBER_RETURN_NOT_OK(read);
  if (verdict == kVerdictRejected) {
    return Status::Unauthenticated(peer + " rejected the handshake: the job secret does not match");
  }
  if (verdict != kVerdictAccepted) {
    return Status::Unavailable(peer + " sent an unknown handshake verdict " + std::to_string(verdict));
  }
  Mac proof;
  EMBER_RETURN_NOT_OK(ReadExactly(fd, proof.data(), proof.size(), deadline, "handshake from " + peer));
  Mac expected;
  EMBER_RETURN_NOT_OK(ComputeMac(secret, kServerLabel, nonce_c, nonce_s, &expected));
  if (CRYPTO_memcmp(expected.data(), proof.data(), kMacBytes) != 0) {
    return Status::Unauthenticated(peer + " failed to prove the job secret (bad server HMAC)");
  }
  return Status::OK();
}

}  // namespace

Result<std::string> DeriveSecret(const std::string& secret, std::string_view label) {
  Mac key;
  EMBER_RETURN_NOT_OK(Hmac(secret, label, &key));
  return std::string(reinterpret_cast<const char*>(key.data()), key.size());
}

Status ClientHandshake(int fd, const std::string& secret, Deadline deadline, const std::string& peer) {
  bool closed = false;
  return ClientHandshakeImpl(fd, secret, deadline, peer, &closed);
}

Result<Fd> Dial(const std::string& host, int port, const std::string& secret, Deadline deadline,
                const std::string& peer, bool* connect_failed) {
  if (connect_failed != nullptr) *connect_failed = false;
  Duration backoff{10};
  for (int attempt = 1;; ++attempt) {
    Result<Fd> fd = Connect(host, port, deadline);
    if (!fd.ok()) {
      if (connect_failed != nullptr) *connect_failed = true;
      return fd.status();
    }
    bool closed = false;
    Status hs = ClientHandshakeImpl(fd->get(), secret, deadline, peer, &closed);
    if (hs.ok()) return fd;
    if (!closed || deadline.expired()) {
      if (closed && attempt > 1) {
        return Status::Unavailable(hs.message() + " (" + std::to_string(attempt) + " attempts)");
      }
      return hs;
    }
    std::this_thread::sleep_for(std::min(backoff, deadline.remaining()));
    backoff = std::min(backoff * 2, Duration(200));
  }
}

}  // namespace ember::tcp
