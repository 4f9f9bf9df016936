"""botocore's errors mapped into :mod:`ackwise.errors`, in one place.

::

    botocore.exceptions.ClientError (an error answer of SQS)
    ├── throttling codes, HTTP 5xx              → TransientAdapterError
    ├── access denied, bad or expired tokens    → AuthenticationFailed
    ├── missing queue                           → QueueNotFound
    └── anything else (bad request)             → PermanentAdapterError
    botocore.exceptions.BotoCoreError (no answer)
    ├── connection errors, timeouts, cut reads  → BrokerUnavailable
    ├── no or partial credentials               → AuthenticationFailed
    ├── no region                               → ConfigurationError
    └── anything else (bad parameters, …)       → PermanentAdapterError

Every mapped error is re-raised ``from`` botocore's.  Messages never carry credentials (botocore
does not put them in its messages; the URL carries none).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from botocore import exceptions as bx

from ackwise.errors import (
    AckwiseError,
    AuthenticationFailed,
    BrokerUnavailable,
    ConfigurationError,
    PermanentAdapterError,
    QueueNotFound,
    StaleReceipt,
    TransientAdapterError,
)

__all__ = [
    "AUTH_CODES",
    "MISSING_QUEUE_CODES",
    "THROTTLING_CODES",
    "VisibilityCapReached",
    "map_botocore_errors",
    "translate_botocore_error",
]

THROTTLING_CODES = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "TooManyRequestsException",
        "RequestLimitExceeded",
        "SlowDown",
        "KMS.ThrottlingException",
        "ServiceUnavailable",
        "InternalError",
        "InternalFailure",
        "RequestTimeout",
        "RequestTimeoutException",
    }
)
AUTH_CODES = frozenset(
    {
        "AccessDenied",
        "AccessDeniedException",
        "InvalidClientTokenId",
        "UnrecognizedClientException",
        "SignatureDoesNotMatch",
        "IncompleteSignature",
        "MissingAuthenticationToken",
        "InvalidSecurity",
        "ExpiredToken",
        "ExpiredTokenException",
        "AuthFailure",
        "KMS.AccessDeniedException",
    }
)
MISSING_QUEUE_CODES = frozenset(
    {
        "AWS.SimpleQueueService.NonExistentQueue",
        "QueueDoesNotExist",
        "NonExistentQueue",
    }
)

_CONNECTION_ERRORS: tuple[type[Exception], ...] = (
    bx.ConnectionError,  # EndpointConnectionError, ConnectionClosedError, timeouts, proxy errors
    bx.HTTPClientError,  # ReadTimeoutError, ConnectTimeoutError, cut connections
    bx.IncompleteReadError,
    bx.ResponseStreamingError,
)


class VisibilityCapReached(StaleReceipt):
    """A lease cannot be renewed: SQS holds a message invisible at most 12 hours per receive.

    The deliveries named were extended as far as the cap allows; after it they become visible
    again and may run a second time elsewhere.  Give such tasks a ``time_limit`` under 12 hours.
    """

    def __init__(self, deliveries: object, cap: float) -> None:
        super().__init__(deliveries, "extend")  # type: ignore[arg-type]
        ids = ", ".join(d.message_id for d in self.deliveries[:5])
        self.args = (
            f"extend: message(s) {ids} reached SQS's cap of {cap:.0f}s of visibility per "
            "receive; the lease cannot be renewed past it, so the message will become visible "
            "again and may run twice: give the task a time_limit under 12 hours",
        )

    def __str__(self) -> str:
        return str(self.args[0])


def error_code(exc: bx.ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def translate_botocore_error(exc: Exception, what: str = "SQS") -> AckwiseError:
    """Return the :mod:`ackwise.errors` instance for botocore's ``exc`` (not raised)."""
    if isinstance(exc, bx.ClientError):
        code = error_code(exc)
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        message = f"{what}: {code or 'error'}: {exc.response.get('Error', {}).get('Message', '')}"
        if code in MISSING_QUEUE_CODES:
            return QueueNotFound(message)
        if code in AUTH_CODES or (status in (401, 403) and code not in THROTTLING_CODES):
            return AuthenticationFailed(message)
        if code in THROTTLING_CODES or status >= 500 or status == 429:
            return TransientAdapterError(message)
        return PermanentAdapterError(message)
    if isinstance(exc, _CONNECTION_ERRORS):
        return BrokerUnavailable(f"{what}: cannot reach SQS: {exc}")
    if isinstance(exc, bx.NoCredentialsError | bx.PartialCredentialsError):
        return AuthenticationFailed(
            f"{what}: no usable AWS credentials ({type(exc).__name__}); set them in the "
            "environment, a profile or a role"
        )
    if isinstance(exc, bx.NoRegionError):
        return ConfigurationError(
            f"{what}: no AWS region: add ?region=… to the sqs:// URL or set AWS_DEFAULT_REGION"
        )
    if isinstance(exc, bx.BotoCoreError):
        return PermanentAdapterError(f"{what}: {type(exc).__name__}: {exc}")
    raise TypeError(f"not a botocore error: {exc!r}")


@contextlib.contextmanager
def map_botocore_errors(what: str = "SQS") -> Iterator[None]:
    """Re-raise botocore's errors as :mod:`ackwise.errors`, ``from`` the original."""
    try:
        yield
    except (bx.ClientError, bx.BotoCoreError) as exc:
        raise translate_botocore_error(exc, what) from exc
