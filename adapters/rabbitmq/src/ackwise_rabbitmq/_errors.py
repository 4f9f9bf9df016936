"""pika's exceptions mapped into :mod:`ackwise.errors`, in one place.

Every exception class of :mod:`pika.exceptions` has an explicit entry in :data:`ERROR_MAP`
(a test fails when pika grows one that is not listed)::

    pika                                         ackwise
    AMQPConnectionError, StreamLostError,    →   BrokerUnavailable          (transient)
      ConnectionClosedByBroker 320 (broker shutting down), AMQPHeartbeatTimeout,
      ConnectionOpenAborted, IncompatibleProtocolError (a reset during the handshake)
    ChannelClosedByBroker 406 PRECONDITION_FAILED "…timeout…" (consumer ack timeout),
      ChannelClosedByBroker 320/541 and the rest of the connection errors → TransientAdapterError
    ProbableAuthenticationError, AuthenticationError, ProbableAccessDeniedError,
      ConnectionClosedByBroker 403                     → AuthenticationFailed  (permanent)
    ChannelClosedByBroker 404                          → QueueNotFound          (permanent)
    NackError, UnroutableError                         → PermanentAdapterError  (the broker
      refused or could not route the message: retrying the same publish will not help)
    everything else (406 inequivalent arguments, protocol errors, …) → PermanentAdapterError

The worker reconnects with backoff on a transient error (``close()`` then ``open()``); a
permanent one stops it with the reason.  Messages name the broker by host, port and vhost:
never the credentials.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

import pika.exceptions as px

from ackwise.errors import (
    AdapterError,
    AuthenticationFailed,
    BrokerUnavailable,
    PermanentAdapterError,
    QueueNotFound,
    TransientAdapterError,
)
from ackwise.spi import ErrorTable, from_table, mapping_errors, redact

__all__ = ["ERROR_MAP", "map_pika_errors", "translate_pika_error"]

_T, _U, _A, _P = (
    TransientAdapterError,
    BrokerUnavailable,
    AuthenticationFailed,
    PermanentAdapterError,
)

#: pika exception class -> (ackwise class, what it means here).
ERROR_MAP: ErrorTable = {
    px.AMQPError: (_P, "AMQP error"),
    px.AMQPConnectionError: (_U, "cannot reach RabbitMQ"),
    px.ConnectionOpenAborted: (_U, "the connection attempt was aborted"),
    px.StreamLostError: (_U, "the connection to RabbitMQ was lost"),
    px.AMQPHeartbeatTimeout: (_U, "RabbitMQ stopped answering heartbeats"),
    px.ConnectionBlockedTimeout: (
        _T,
        "RabbitMQ blocked the connection too long (a memory or disk alarm)",
    ),
    px.ConnectionClosed: (_U, "the connection was closed"),
    px.ConnectionClosedByBroker: (_U, "RabbitMQ closed the connection"),
    px.ConnectionClosedByClient: (_U, "the connection was closed by this client"),
    px.ConnectionWrongStateError: (_U, "the connection is not open"),
    # pika raises this too when the connection is reset during the handshake (a proxy, a
    # broker restarting): transient, bounded by the worker's --broker-timeout.
    px.IncompatibleProtocolError: (_U, "the AMQP handshake failed"),
    px.ProtocolVersionMismatch: (_P, "AMQP protocol version mismatch"),
    px.AuthenticationError: (_A, "RabbitMQ refused the credentials"),
    px.ProbableAuthenticationError: (_A, "RabbitMQ refused the credentials"),
    px.ProbableAccessDeniedError: (_A, "RabbitMQ denied access to the vhost"),
    px.NoFreeChannels: (_T, "no free AMQP channel on the connection"),
    px.AMQPChannelError: (_T, "AMQP channel error"),
    px.ChannelError: (_T, "AMQP channel error"),
    px.ChannelWrongStateError: (_T, "the channel is not open"),
    px.ChannelClosed: (_T, "the channel was closed"),
    px.ChannelClosedByBroker: (_T, "RabbitMQ closed the channel"),
    px.ChannelClosedByClient: (_T, "the channel was closed by this client"),
    px.ConsumerCancelled: (_T, "RabbitMQ cancelled the consumer (queue deleted or failover)"),
    px.DuplicateConsumerTag: (_P, "duplicate consumer tag"),
    px.DuplicateGetOkCallback: (_P, "a basic.get is already pending"),
    px.InvalidChannelNumber: (_P, "invalid channel number"),
    px.InvalidFieldTypeException: (_P, "a header value AMQP cannot encode"),
    px.UnsupportedAMQPFieldException: (_P, "a header value AMQP cannot encode"),
    px.InvalidFrameError: (_T, "RabbitMQ sent an invalid frame; reconnecting"),
    px.UnexpectedFrameError: (_T, "RabbitMQ sent an unexpected frame; reconnecting"),
    px.MethodNotImplemented: (_P, "AMQP method not implemented"),
    px.ProtocolSyntaxError: (_P, "AMQP protocol syntax error"),
    px.BodyTooLongError: (_P, "message body longer than announced"),
    px.ShortStringTooLong: (_P, "a name longer than 255 bytes (queue, header or message id)"),
    px.ReentrancyError: (_P, "pika was called re-entrantly"),
    px.NackError: (_P, "RabbitMQ refused (nacked) the published message(s)"),
    px.UnroutableError: (_P, "RabbitMQ could not route the published message(s)"),
}

_CAUGHT: tuple[type[BaseException], ...] = tuple(ERROR_MAP)


def _reply(exc: BaseException) -> tuple[int | None, str]:
    code = getattr(exc, "reply_code", None)
    text = getattr(exc, "reply_text", None)
    return (code if isinstance(code, int) else None), str(text or "")


def _detail(exc: BaseException) -> str:
    """What went wrong, in pika's words: an ``AMQPConnectionError`` prints as nothing, its
    cause (e.g. ``ConnectionRefusedError``) sits in the connector error it wraps."""
    text = str(exc)
    if text:
        return text
    for arg in exc.args:
        inner = getattr(arg, "exception", None)
        if isinstance(inner, BaseException):
            return f"{type(inner).__name__}: {inner}"
    return type(exc).__name__


def translate_pika_error(
    exc: BaseException, where: str = "RabbitMQ", secret: str | None = None
) -> AdapterError:
    """Return the :mod:`ackwise.errors` exception for a pika (or socket) error; not raised."""
    detail = redact(_detail(exc), secret)
    if isinstance(exc, OSError):
        return BrokerUnavailable(f"{where}: cannot reach RabbitMQ: {detail}")
    code, text = _reply(exc)
    if isinstance(exc, px.ChannelClosedByBroker | px.ConnectionClosedByBroker) and code:
        if code == 404:
            return QueueNotFound(f"{where}: {text or detail} (404 NOT_FOUND)")
        if code in (403, 530):
            return AuthenticationFailed(f"{where}: access refused: {text or detail} ({code})")
        if code == 406 and ("timeout" in text.lower() or "timed out" in text.lower()):
            # consumer_timeout: RabbitMQ closes the channel of a delivery held too long.
            return TransientAdapterError(
                f"{where}: RabbitMQ closed the channel because a delivery was not acknowledged "
                f"within its consumer_timeout ({text}); reconnecting, the message is redelivered"
            )
        if code == 406:
            return PermanentAdapterError(f"{where}: PRECONDITION_FAILED: {text or detail}")
        if code in (320, 541, 504, 505, 506):
            return BrokerUnavailable(f"{where}: {text or detail} ({code})")
    return from_table(exc, ERROR_MAP, where, detail)


def map_pika_errors(
    where: str = "RabbitMQ", secret: str | None = None
) -> AbstractContextManager[None]:
    """Re-raise every pika error (and socket error) as an :mod:`ackwise.errors` one.

    Always ``from`` the driver's exception, so the cause stays in the traceback.
    """
    return mapping_errors(translate_pika_error, _CAUGHT, where, secret)
