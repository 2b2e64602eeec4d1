"""Network helpers shared by the driver and the launchers (standard library only)."""
from __future__ import annotations

import socket


def routable_address(peer_host: str, peer_port: int) -> str:
    """This host's address on the route to `peer_host`, which peers can therefore reach."""
    try:
        family, _, _, _, sockaddr = socket.getaddrinfo(peer_host, peer_port, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect(sockaddr)  # UDP: picks a route, sends nothing
            address = s.getsockname()[0]
        if address not in ("0.0.0.0", "::"):
            return address
    except OSError:
        pass
    return socket.gethostname()
