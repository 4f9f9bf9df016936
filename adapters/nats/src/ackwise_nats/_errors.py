"""nats-py's exceptions (and the JetStream API's error replies) mapped into
:mod:`ackwise.errors`, in one place::

    nats-py / JetStream                               ackwise
    NoServersError, ConnectionClosedError,        →   BrokerUnavailable       (transient)
      StaleConnectionError, OSError
    TimeoutError, OutboundBufferLimitError,       →   TransientAdapterError
      ConnectionReconnectingError, API 500/503,
      NoRespondersError (no JetStream, or not yet after a restart)
    AuthorizationError                            →   AuthenticationFailed    (permanent)
    API 404 (stream or consumer not found)        →   QueueNotFound           (permanent)
    everything else                               →   PermanentAdapterError

The worker reconnects with backoff on a transient error (``close()`` then ``open()``); a
permanent one stops it with the reason.  Messages name the server by scheme, host and port,
never with credentials.
"""

from __future__ import annotations

import asyncio
from contextlib import AbstractContextManager

import nats.errors as nx

from ackwise.errors import (
    AdapterError,
    AuthenticationFailed,
    BrokerUnavailable,
    PermanentAdapterError,
    QueueNotFound,
    TransientAdapterError,
)
from ackwise.spi import ErrorTable, from_table, mapping_errors, redact

__all__ = ["ERROR_MAP", "JetStreamError", "map_nats_errors", "translate_nats_error"]


class JetStreamError(Exception):
    """An error reply of the JetStream API (``{"error": {"code", "err_code", "description"}}``)."""

    def __init__(self, code: int, err_code: int, description: str) -> None:
        self.code = code
        self.err_code = err_code
        self.description = description
        super().__init__(f"{description} (JetStream error {code}/{err_code})")


_T, _U, _A, _P = (
    TransientAdapterError,
    BrokerUnavailable,
    AuthenticationFailed,
    PermanentAdapterError,
)

#: nats-py exception class -> (ackwise class, what it means here).
ERROR_MAP: ErrorTable = {
    nx.Error: (_P, "NATS error"),
    nx.NoServersError: (_U, "cannot reach NATS"),
    nx.ConnectionClosedError: (_U, "the NATS connection is closed"),
    nx.StaleConnectionError: (_U, "the NATS connection went stale"),
    nx.ConnectionReconnectingError: (_T, "NATS is reconnecting"),
    nx.ConnectionDrainingError: (_T, "the NATS connection is draining"),
    nx.OutboundBufferLimitError: (_T, "the NATS client's outbound buffer is full"),
    nx.TimeoutError: (_T, "NATS did not answer in time"),
    # Also while a restarted server is still loading its streams: retried, never fatal.
    nx.NoRespondersError: (
        _T,
        "JetStream does not answer (loading after a restart; or start nats-server with "
        "--jetstream, or check the account's JetStream permissions)",
    ),
    nx.AuthorizationError: (_A, "NATS refused the credentials"),
    nx.SecureConnRequiredError: (_P, "the server requires TLS: use a nats+tls:// URL"),
    nx.SecureConnWantedError: (_P, "the server does not offer TLS: use a nats:// URL"),
    nx.SecureConnFailedError: (_P, "the TLS handshake with NATS failed"),
    nx.MaxPayloadError: (_P, "the message exceeds the server's max_payload"),
    nx.BadSubjectError: (_P, "invalid NATS subject"),
    nx.ProtocolError: (_T, "NATS protocol error; reconnecting"),
    asyncio.TimeoutError: (_T, "NATS did not answer in time"),
    OSError: (_U, "cannot reach NATS"),
}

_CAUGHT: tuple[type[BaseException], ...] = (*ERROR_MAP, JetStreamError)


def translate_nats_error(
    exc: BaseException, where: str = "NATS", secret: str | None = None
) -> AdapterError:
    """Return the :mod:`ackwise.errors` exception for a nats-py or JetStream error; not raised."""
    detail = redact(str(exc) or type(exc).__name__, secret)
    if isinstance(exc, JetStreamError):
        if exc.code == 404:
            return QueueNotFound(f"{where}: {detail}")
        if exc.code in (408, 500, 503):
            return TransientAdapterError(f"{where}: JetStream is not available now: {detail}")
        return PermanentAdapterError(f"{where}: JetStream refused the request: {detail}")
    return from_table(exc, ERROR_MAP, where, detail)


def map_nats_errors(where: str = "NATS", secret: str | None = None) -> AbstractContextManager[None]:
    """Re-raise every nats-py, JetStream and socket error as an :mod:`ackwise.errors` one."""
    return mapping_errors(translate_nats_error, _CAUGHT, where, secret)
