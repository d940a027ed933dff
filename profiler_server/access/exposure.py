"""What a listener's address exposes: loopback or the network. A server reachable from the
network without TLS and tokens would let any peer write or read every profile, so it
refuses to start unless told `--insecure`."""

from __future__ import annotations

import ipaddress
import socket

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def split_host(address: str) -> str:
    """The host of `HOST:PORT` (`[::1]:80` gives `::1`)."""
    return address.rpartition(":")[0].strip("[]")


def is_loopback(host: str) -> bool:
    """True for `localhost` and loopback IPs; any other name may resolve to the network."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_wildcard(host: str) -> bool:
    return host in ("", "0.0.0.0", "::")


def default_allowed_hosts(http: str) -> frozenset[str]:
    """Host header values the HTTP listener takes when `--allowed-hosts` is empty: the
    loopback names and the bound address, and bound beyond loopback also this machine's
    names."""
    host = split_host(http)
    names = set(LOOPBACK_NAMES)
    if not is_wildcard(host):
        names.add(host)
    if not is_loopback(host):
        names |= {socket.gethostname(), socket.getfqdn()}
    return frozenset(name.lower() for name in names)


TLS = "TLS (--tls-cert, --tls-key)"


def refusals(
    *, listen: str, http: str, tls: bool, ingest_tokens: bool, read_token: bool
) -> list[str]:
    """Why serving on these addresses would be open to the network (empty: it is not)."""
    listeners = (
        (
            "gRPC ingest",
            listen,
            {TLS: tls, "ingest tokens (--ingest-tokens-file)": ingest_tokens},
            "write profiles",
        ),
        (
            "HTTP",
            http,
            {TLS: tls, "a read token (--read-token-file)": read_token},
            "read every profile",
        ),
    )
    found = []
    for name, address, needs, harm in listeners:
        missing = [what for what, given in needs.items() if not given]
        if missing and not is_loopback(split_host(address)):
            found.append(
                f"{name} on {address} is reachable from the network without "
                f"{' and '.join(missing)}: any peer could {harm}"
            )
    return found
