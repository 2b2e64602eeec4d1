// Test helper: a connected pair of loopback TCP sockets.
#pragma once

#include <gtest/gtest.h>

#include <utility>

#include "transport/tcp/socket.h"

namespace ember::tcp::testing {

inline std::pair<Fd, Fd> LoopbackPair() {
  Result<Fd> listener = Listen("127.0.0.1", 0);
  EXPECT_TRUE(listener.ok()) << listener.status().ToString();
  Result<int> port = LocalPort(listener->get());
  EXPECT_TRUE(port.ok());
  Result<Fd> client = Connect("127.0.0.1", *port, Deadline::After(Duration(5000)));
  EXPECT_TRUE(client.ok()) << client.status().ToString();
  Result<Fd> server = Accept(listener->get(), Deadline::After(Duration(5000)));
  EXPECT_TRUE(server.ok()) << server.status().ToString();
  return {server.MoveValueUnsafe(), client.MoveValueUnsafe()};
}

}  // namespace ember::tcp::testing
