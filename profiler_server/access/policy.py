"""The server's access policy, read once at start-up from its settings: certificates,
token files, the Host allow-list. Anything wrong stops the start with a message that says
what and how to fix it."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from profiler_server.access import exposure
from profiler_server.access.tokens import IngestTokens, ReadToken, TokenFileError
from profiler_server.settings import Settings


class AccessError(SystemExit):
    """The server must not start: the message says why."""


def _pem(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise AccessError(f"cannot read {what} {path}: {exc}") from None


def _check_pems(settings: Settings) -> None:
    """Loads the certificate, its key and the client CA as TLS will, so a wrong file or a
    key of another certificate stops the start here, named, not deep inside gRPC."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(settings.tls_cert, settings.tls_key)
    except (OSError, ssl.SSLError) as exc:
        raise AccessError(f"cannot use --tls-cert/--tls-key: {exc}") from None
    if settings.tls_client_ca:
        try:
            context.load_verify_locations(settings.tls_client_ca)
        except (OSError, ssl.SSLError) as exc:
            raise AccessError(f"cannot use --tls-client-ca: {exc}") from None


@dataclass(frozen=True)
class AccessPolicy:
    settings: Settings
    ingest_tokens: IngestTokens | None
    read_token: ReadToken | None
    allowed_hosts: frozenset[str]
    exposed: tuple[str, ...]  # what --insecure let through, for the log

    @classmethod
    def from_settings(cls, settings: Settings) -> AccessPolicy:
        if bool(settings.tls_cert) != bool(settings.tls_key):
            raise AccessError("--tls-cert and --tls-key go together: give both or neither")
        if settings.tls_client_ca and not settings.tls_cert:
            raise AccessError("--tls-client-ca needs TLS: give --tls-cert and --tls-key too")
        if settings.tls_cert:
            _check_pems(settings)
        try:
            ingest = (
                IngestTokens.load(settings.ingest_tokens_file)
                if settings.ingest_tokens_file
                else None
            )
            read = ReadToken.load(settings.read_token_file) if settings.read_token_file else None
        except TokenFileError as exc:
            raise AccessError(str(exc)) from None
        refusals = exposure.refusals(
            listen=settings.listen,
            http=settings.http,
            tls=bool(settings.tls_cert),
            ingest_tokens=ingest is not None,
            read_token=read is not None,
        )
        if refusals and not settings.insecure:
            raise AccessError(
                "refusing to start: "
                + "; ".join(refusals)
                + ". Give what is missing, bind to 127.0.0.1, or pass --insecure to accept it."
            )
        hosts = settings.allowed_hosts or exposure.default_allowed_hosts(settings.http)
        return cls(settings, ingest, read, hosts, tuple(refusals))

    @property
    def tls(self) -> bool:
        return bool(self.settings.tls_cert)

    def grpc_credentials(self) -> grpc.ServerCredentials | None:
        """TLS for the ingest listener; with a client CA, hosts must present a certificate."""
        if not self.tls:
            return None
        s = self.settings
        client_ca = _pem(s.tls_client_ca, "--tls-client-ca") if s.tls_client_ca else None
        return grpc.ssl_server_credentials(
            [(_pem(s.tls_key, "--tls-key"), _pem(s.tls_cert, "--tls-cert"))],
            root_certificates=client_ca,
            require_client_auth=client_ca is not None,
        )

    def uvicorn_tls(self) -> dict[str, Any]:
        """uvicorn.Config's TLS arguments for the HTTP listener."""
        if not self.tls:
            return {}
        return {"ssl_certfile": self.settings.tls_cert, "ssl_keyfile": self.settings.tls_key}
