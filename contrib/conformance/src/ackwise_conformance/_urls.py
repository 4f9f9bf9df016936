"""The network address in a broker URL: read it, point the URL elsewhere (a fault proxy).

Shared by :mod:`~ackwise_conformance.brokers` and :mod:`~ackwise_conformance.broker_views`.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

__all__ = ["address_of", "replace_address"]

_DEFAULT_PORTS = {"redis": 6379, "rediss": 6379, "amqp": 5672, "amqps": 5671}


def address_of(url: str) -> tuple[str | None, int | None]:
    """The host and port of the broker at ``url`` (an SQS URL's ``endpoint_url``'s), or
    ``(None, None)`` where it has none of its own (an embedded broker, real AWS)."""
    parts = urlsplit(url)
    if parts.scheme == "sqs":
        endpoint = dict(parse_qsl(parts.query)).get("endpoint_url")
        if not endpoint:
            return None, None  # real AWS: no address of ours to proxy
        parts = urlsplit(endpoint)
    if not parts.hostname:
        return None, None
    return parts.hostname, parts.port or _DEFAULT_PORTS.get(parts.scheme)


def replace_address(url: str, host: str, port: int) -> str:
    """``url`` pointing at ``host:port`` instead (an SQS URL: its ``endpoint_url``)."""
    parts = urlsplit(url)
    if parts.scheme == "sqs":
        query = parse_qsl(parts.query, keep_blank_values=True)
        replaced = []
        for key, value in query:
            if key == "endpoint_url":
                value = replace_address(value, host, port)
            replaced.append((key, value))
        # Not urlunsplit: with an empty host it would write "sqs:?..." without the "//".
        query_text = urlencode(replaced, safe=":/")
        fragment = f"#{parts.fragment}" if parts.fragment else ""
        return f"{parts.scheme}://{parts.netloc}{parts.path}?{query_text}{fragment}"
    userinfo, at, _ = parts.netloc.rpartition("@")
    hostport = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return urlunsplit(parts._replace(netloc=f"{userinfo}{at}{hostport}"))
