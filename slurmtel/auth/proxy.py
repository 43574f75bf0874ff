"""A trusted reverse proxy's user header (a web portal such as Open OnDemand).

The header is believed only when the TCP peer is one of the configured proxy networks: from
anywhere else anyone could send it. A proxy must strip the header from what its clients send
(Apache: `RequestHeader unset X-Remote-User` before setting it).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable

from slurmtel.errors import ConfigError

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
# this machine: `slurmtel serve --dev-user` listens and answers only here
LOOPBACK: tuple[Network, ...] = (ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128"))
_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@-]{0,63}")


def parse_networks(cidrs: Iterable[str], key: str = "api.trusted_proxies") -> tuple[Network, ...]:
    """Addresses and networks ("10.0.0.5", "10.0.0.0/24", "fd00::/64"); ConfigError names a bad one."""
    networks: list[Network] = []
    for cidr in cidrs:
        try:
            networks.append(ipaddress.ip_network(cidr.strip(), strict=True))
        except ValueError as exc:
            raise ConfigError(f"{key}: '{cidr}' is not an address or network ({exc})") from None
    return tuple(networks)


def peer_in(peer_address: str, networks: Iterable[Network]) -> bool:
    """Whether PEER_ADDRESS (as the socket reports it; an IPv4-mapped IPv6 address counts as
    its IPv4 address) is in one of NETWORKS. An unparsable address is in none."""
    try:
        address = ipaddress.ip_address(peer_address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return any(address.version == n.version and address in n for n in networks)


def valid_user_name(value: str) -> bool:
    return bool(_USER.fullmatch(value))


def is_loopback(address: str) -> bool:
    """Whether ADDRESS (a listen address as configured) is this machine only."""
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return False
