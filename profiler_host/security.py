"""How the host proves itself to the server and checks the server: TLS for the channel
(the server's CA, optionally a client certificate for mutual TLS) and the ingest token,
sent as `authorization: Bearer <token>` metadata on the stream. The relay process makes the
channel from these settings (`relay.open_channel`) and reads the files at each connection,
so renewed certificates are picked up without restarting the app."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ChannelSecurity:
    token: str = ""
    tls: bool = False  # also on when a CA or client certificate is given
    ca: str = ""  # PEM file of the CA that signed the server's certificate; empty: system CAs
    cert: str = ""  # client certificate (mutual TLS), with `key`
    key: str = ""

    @property
    def uses_tls(self) -> bool:
        return self.tls or bool(self.ca or self.cert)

    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()


def check_files(security: ChannelSecurity) -> None:
    """Fails (ValueError naming the option) when a file is missing or half a pair is given,
    so a typo shows at start-up instead of as a stream that never connects."""
    if bool(security.cert) != bool(security.key):
        raise ValueError("--tls-cert and --tls-key go together: give both or neither")
    for option, path in (
        ("--tls-ca", security.ca),
        ("--tls-cert", security.cert),
        ("--tls-key", security.key),
    ):
        if path and not Path(path).is_file():
            raise ValueError(f"{option}: no such file: {path}")
