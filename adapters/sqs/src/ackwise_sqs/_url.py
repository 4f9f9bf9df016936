"""``sqs://`` URLs: what they may say and how they are checked.

::

    sqs://?region=eu-west-1&prefix=myapp-
    sqs://?endpoint_url=http://127.0.0.1:5000&region=us-east-1      (moto, ElasticMQ, LocalStack)

Options (all optional):

``region``
    the AWS region; else the normal AWS configuration (``AWS_DEFAULT_REGION``, the profile).
``endpoint_url``
    another SQS endpoint (an emulator); ``http`` or ``https``.
``prefix``
    prepended to every queue name (``prefix=myapp-``: ackwise queue ``default`` is the SQS queue
    ``myapp-default``); letters, digits, ``-`` and ``_``.
``profile``
    a named profile of the AWS configuration files.
``message_group``
    the ``MessageGroupId`` of FIFO queues when neither the message (header
    ``message_group_id``) nor the queue (option ``message_group_id``) names one; default
    ``default``.
``max_native_delay``
    delays up to this many seconds use ``DelaySeconds`` (at most, and by default, 900); longer
    ones are re-armed by visibility.  Tests lower it to take the long-delay path quickly.

Credentials never come from the URL: boto3 finds them in the normal AWS chain (environment,
profile, container or instance role).  A URL with a user or password is refused, so a secret
cannot end up in a log line through a URL.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from ackwise.errors import InvalidBrokerURL
from ackwise.spi import BrokerURL

__all__ = ["MAX_DELAY_SECONDS", "SQSSettings", "parse_sqs_url"]

#: SQS's own bound on ``DelaySeconds`` (15 minutes).
MAX_DELAY_SECONDS = 900

_OPTIONS = frozenset(
    {"region", "endpoint_url", "prefix", "profile", "message_group", "max_native_delay"}
)
_PREFIX = re.compile(r"^[A-Za-z0-9_-]{0,40}$")
_REGION = re.compile(r"^[a-z0-9-]{1,40}$")


@dataclass(frozen=True)
class SQSSettings:
    """What an ``sqs://`` URL says."""

    region: str | None = None
    endpoint_url: str | None = None
    prefix: str = ""
    profile: str | None = None
    message_group: str = "default"
    max_native_delay: float = float(MAX_DELAY_SECONDS)


def parse_sqs_url(url: BrokerURL) -> SQSSettings:
    """Check ``url`` and return its settings; raise :class:`InvalidBrokerURL` naming the problem."""
    where = f"broker URL {url}"
    if url.scheme != "sqs":
        raise InvalidBrokerURL(f"{where}: the SQS adapter serves 'sqs://' URLs")
    if url.username or url.password:
        raise InvalidBrokerURL(
            f"{where}: credentials in the URL are not accepted; boto3 takes them from the "
            "normal AWS chain (environment, profile, role)"
        )
    if url.host or url.port or url.path.strip("/"):
        raise InvalidBrokerURL(
            f"{where}: expected 'sqs://?region=…' (options in the query string only)"
        )
    unknown = sorted(set(url.query) - _OPTIONS)
    if unknown:
        raise InvalidBrokerURL(
            f"{where}: unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(_OPTIONS))}"
        )
    q = url.query
    region = q.get("region") or None
    if region is not None and not _REGION.match(region):
        raise InvalidBrokerURL(f"{where}: region {region!r} is not a region name")
    endpoint = q.get("endpoint_url") or None
    if endpoint is not None:
        parts = urlsplit(endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise InvalidBrokerURL(
                f"{where}: endpoint_url must be an http(s) URL, e.g. http://127.0.0.1:5000"
            )
    prefix = q.get("prefix", "")
    if not _PREFIX.match(prefix):
        raise InvalidBrokerURL(f"{where}: prefix {prefix!r}: up to 40 letters, digits, '-' or '_'")
    group = q.get("message_group", "default")
    if not 1 <= len(group) <= 128:
        raise InvalidBrokerURL(f"{where}: message_group must have 1-128 characters")
    try:
        max_native_delay = float(q.get("max_native_delay", MAX_DELAY_SECONDS))
    except ValueError:
        raise InvalidBrokerURL(f"{where}: max_native_delay must be a number of seconds") from None
    if not 0 < max_native_delay <= MAX_DELAY_SECONDS:
        raise InvalidBrokerURL(
            f"{where}: max_native_delay must be > 0 and at most {MAX_DELAY_SECONDS} seconds "
            "(SQS's DelaySeconds limit)"
        )
    return SQSSettings(
        region=region,
        endpoint_url=endpoint,
        prefix=prefix,
        profile=q.get("profile") or None,
        message_group=group,
        max_native_delay=max_native_delay,
    )
