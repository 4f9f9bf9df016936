"""Where a queue lives in JetStream: its streams, subjects and consumers.

A queue ``q`` under the prefix ``p`` is::

    stream   p-q-<q>     work-queue retention, subjects p.q.<q>.ready and p.q.<q>.delayed
    consumer ready       durable pull consumer of p.q.<q>.ready (what workers receive)
    consumer delayed     durable pull consumer of p.q.<q>.delayed (moves due messages)
    stream   p-d-<q>     limits retention, subject p.d.<q>: the dead letters

``<q>`` is the queue name with every character but ASCII letters, digits and ``-`` written
``_xx`` (its UTF-8 bytes in hex), so any queue name makes valid stream names and subject
tokens, and two names never share one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["QueueNames", "decode", "encode"]

_PLAIN = re.compile(r"[A-Za-z0-9-]")
_ESCAPE = re.compile(r"_([0-9a-f]{2})")

READY_CONSUMER = "ready"
DELAYED_CONSUMER = "delayed"


def encode(queue: str) -> str:
    return "".join(
        c if _PLAIN.fullmatch(c) else "".join(f"_{b:02x}" for b in c.encode()) for c in queue
    )


def decode(token: str) -> str | None:
    """The queue name of an encoded token, or ``None`` when ackwise did not write it."""
    raw = bytearray()
    i = 0
    while i < len(token):
        if token[i] == "_":
            m = _ESCAPE.match(token, i)
            if m is None:
                return None
            raw.append(int(m.group(1), 16))
            i += 3
        else:
            raw.extend(token[i].encode())
            i += 1
    try:
        name = raw.decode()
    except UnicodeDecodeError:
        return None
    return name if encode(name) == token else None


@dataclass(frozen=True)
class QueueNames:
    queue: str
    stream: str
    ready: str  # subject
    delayed: str  # subject
    dead_stream: str
    dead: str  # subject

    @classmethod
    def of(cls, prefix: str, queue: str) -> QueueNames:
        token = encode(queue)
        return cls(
            queue=queue,
            stream=f"{prefix}-q-{token}",
            ready=f"{prefix}.q.{token}.ready",
            delayed=f"{prefix}.q.{token}.delayed",
            dead_stream=f"{prefix}-d-{token}",
            dead=f"{prefix}.d.{token}",
        )
