"""Where the gateway is and how to prove who we are: one `Connection` for workers and
producers alike."""

from __future__ import annotations

import os
from dataclasses import dataclass

import grpc

from .errors import ConfigError

#: Largest message either side of a channel accepts (the gateway states its own frame limits).
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
_PathOrPem = str | bytes | os.PathLike[str]


def _read(value: _PathOrPem | None, field: str) -> bytes | None:
    """PEM bytes from bytes given inline or from a file path."""
    if value is None:
        return None
    if isinstance(value, bytes):
        return value
    try:
        with open(value, "rb") as file:
            return file.read()
    except OSError as error:
        raise ConfigError(field, f"{os.fspath(value)}: {error.strerror}") from error


@dataclass(frozen=True)
class Connection:
    """The gateway's address and the caller's credentials.

    `endpoint` is `host:port` (an `https://` prefix is allowed; `http://` means plaintext, for a
    gateway run with `grpc.tls = false` on loopback). `ca` is the CA the gateway's certificate
    chains to (for the development CA, `<data_dir>/tls/ca.pem`); `client_cert` and `client_key`
    present a certificate for mutual TLS (both or neither); `token` is sent as
    `authorization: Bearer <token>`. PEM values are file paths or the bytes themselves.
    """

    #: `host:port` of the gateway's gRPC listener.
    endpoint: str = "127.0.0.1:7700"
    #: CA bundle (path or PEM bytes); None trusts the system roots.
    ca: _PathOrPem | None = None
    #: Bearer token of the caller's principal.
    token: str | None = None
    #: Client certificate chain for mutual TLS (path or PEM bytes).
    client_cert: _PathOrPem | None = None
    #: Private key of `client_cert` (path or PEM bytes).
    client_key: _PathOrPem | None = None
    #: Name the gateway's certificate must be valid for, when not the endpoint's host.
    server_name: str | None = None
    #: Seconds between HTTP/2 keepalive pings on an open channel.
    keepalive_interval: float = 20.0
    #: Seconds a keepalive ping may stay unanswered before the connection counts as lost.
    keepalive_timeout: float = 10.0

    def __post_init__(self) -> None:
        if (self.client_cert is None) != (self.client_key is None):
            raise ConfigError("client_cert", "give client_cert and client_key together")
        if self.token is not None and (not self.token or self.token != self.token.strip()):
            raise ConfigError("token", "empty or with surrounding whitespace")
        if not self._target():
            raise ConfigError("endpoint", "empty")

    def _target(self) -> str:
        for prefix in ("https://", "http://"):
            if self.endpoint.startswith(prefix):
                return self.endpoint[len(prefix) :].rstrip("/")
        return self.endpoint

    @property
    def plaintext(self) -> bool:
        """True for an `http://` endpoint."""
        return self.endpoint.startswith("http://")

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """The call metadata carrying the token, if any."""
        if self.token is None:
            return ()
        return (("authorization", f"Bearer {self.token}"),)

    def channel(self) -> grpc.aio.Channel:
        """A new channel with a TCP connection of its own.

        gRPC Python shares one connection between channels with equal settings unless told
        not to; a worker must not share one with its producer or another worker, so each
        channel gets a local subchannel pool.
        """
        options: list[tuple[str, int | str]] = [
            ("grpc.use_local_subchannel_pool", 1),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.keepalive_time_ms", int(self.keepalive_interval * 1000)),
            ("grpc.keepalive_timeout_ms", int(self.keepalive_timeout * 1000)),
            ("grpc.keepalive_permit_without_calls", 1),
            # Reconnection is the worker runtime's, with its own jittered backoff.
            ("grpc.enable_retries", 0),
        ]
        if self.plaintext:
            return grpc.aio.insecure_channel(self._target(), options=options)
        if self.server_name is not None:
            options.append(("grpc.ssl_target_name_override", self.server_name))
        credentials = grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca, "ca"),
            private_key=_read(self.client_key, "client_key"),
            certificate_chain=_read(self.client_cert, "client_cert"),
        )
        return grpc.aio.secure_channel(self._target(), credentials, options=options)
