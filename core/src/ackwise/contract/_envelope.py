"""The message envelope: versioned JSON, encoded once per message with msgspec.

Wire format (version 1), documented in ``docs/envelope.md``::

    {"v": 1, "id": "…", "task": "module.function", "args": [...], "kwargs": {...},
     "queue": "default", "created_at": 1732870000.123, "eta": null,
     "history": [{"attempt": 1, "at": …, "outcome": "retry", "error": "ValueError: …"}],
     "headers": {...}}
"""

from __future__ import annotations

import math
import os
import random
import re
import time
from typing import Annotated, Any

import msgspec

from ackwise.errors import DecodeError, NotSerializable, PublishError, UnknownEnvelopeVersion

__all__ = [
    "ENVELOPE_VERSION",
    "Attempt",
    "Envelope",
    "check_json",
    "check_queue_name",
    "check_task_name",
    "decode",
    "encode",
]

ENVELOPE_VERSION = 1
"""The envelope format this version writes (``v``); a reader refuses a newer one (docs/envelope.md)."""

_INT_MIN = -(2**63)
_INT_MAX = 2**64 - 1
#: Deepest nesting of lists and dicts an argument may have (the JSON codec recurses).
MAX_DEPTH = 200


class Attempt(msgspec.Struct, omit_defaults=True, kw_only=True):
    """One finished execution attempt, kept in the envelope's history."""

    attempt: int
    at: float
    outcome: str
    error: str | None = None
    traceback: str | None = None
    worker: str | None = None


class Envelope(msgspec.Struct, omit_defaults=True, kw_only=True):
    """What travels through the broker: everything needed to run one task call."""

    v: int  # always written: readers refuse versions they do not know
    id: str
    task: str
    args: list[Any] = msgspec.field(default_factory=list)
    kwargs: dict[str, Any] = msgspec.field(default_factory=dict)
    queue: str
    created_at: float
    eta: float | None = None
    #: 0 (lowest, the default: not written) to 9; a retry is sent with it again.
    priority: Annotated[int, msgspec.Meta(ge=0, le=9)] = 0
    history: list[Attempt] = msgspec.field(default_factory=list)
    headers: dict[str, Any] = msgspec.field(default_factory=dict)


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Envelope)
_probe = msgspec.json.Decoder(dict[str, Any])


#: Message ids come from a generator of this module's own (seeded from the OS, again in every
#: forked child): 128 random bits without a system call per id (``uuid4`` reads the OS's
#: random source each time: 5 to 20 µs a call here), and untouched by ``random.seed()``.
_ids = random.Random()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_ids.seed)


def new_id() -> str:
    """Return a fresh message id: 32 hex digits (128 random bits, as a uuid4's ``hex``)."""
    return f"{_ids.getrandbits(128):032x}"


def encode(envelope: Envelope) -> bytes:
    """Encode ``envelope``; the caller has already checked its contents with check_json."""
    return _encoder.encode(envelope)


def decode(body: bytes) -> Envelope:
    """Decode a body into an envelope.

    :raises UnknownEnvelopeVersion: the body is an envelope of another version.
    :raises DecodeError: the body is not an envelope at all.
    """
    try:
        env = _decoder.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        version = _version_of(body)
        if version is not None and version != ENVELOPE_VERSION:
            raise UnknownEnvelopeVersion(
                f"envelope version {version!r} is not supported; this ackwise reads "
                f"version {ENVELOPE_VERSION}"
            ) from exc
        raise DecodeError(f"message body is not a valid ackwise envelope: {exc}") from exc
    if env.v != ENVELOPE_VERSION:
        raise UnknownEnvelopeVersion(
            f"envelope version {env.v} is not supported; this ackwise reads "
            f"version {ENVELOPE_VERSION}"
        )
    return env


def _version_of(body: bytes) -> object | None:
    try:
        raw = _probe.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return raw.get("v")


def peek_id(body: bytes) -> str | None:
    """Best-effort message id of a body that failed to decode, for error reports."""
    try:
        raw = _probe.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    value = raw.get("id")
    return value if isinstance(value, str) else None


def check_json(task: str, path: str, value: Any) -> None:
    """Raise :class:`NotSerializable` naming the first value under ``path`` JSON cannot hold.

    Only plain JSON types pass (no datetime, set, bytes, dataclass…): what goes in is exactly
    what the task receives.  The walk is iterative (deep values cannot hit the recursion
    limit) and builds a path string only on failure.
    """
    # Each entry: (value, index of the parent entry in `seen`, key in the parent, depth).
    seen: list[tuple[Any, int, Any, int]] = [(value, -1, None, 0)]
    i = 0
    while i < len(seen):
        v, _, _, depth = seen[i]
        t = type(v)
        if t is str or t is bool or v is None:
            pass
        elif t is int:
            if not _INT_MIN <= v <= _INT_MAX:
                _fail(task, path, seen, i)
        elif t is float:
            if not math.isfinite(v):
                _fail(task, path, seen, i)
        elif t is list or t is tuple or t is dict:
            if depth >= MAX_DEPTH:
                _fail(task, path, seen, i, f"nested deeper than {MAX_DEPTH} levels")
            if t is dict:
                for k, item in v.items():
                    if type(k) is not str:
                        seen.append((k, i, _KeyOf(k), depth + 1))
                        _fail(task, path, seen, len(seen) - 1)
                    seen.append((item, i, k, depth + 1))
            else:
                for k, item in enumerate(v):
                    seen.append((item, i, k, depth + 1))
        else:
            _fail(task, path, seen, i)
        i += 1


class _KeyOf:
    def __init__(self, key: Any) -> None:
        self.key = key


def _fail(
    task: str, root: str, seen: list[tuple[Any, int, Any, int]], i: int, why: str | None = None
) -> None:
    value = seen[i][0]
    keys: list[Any] = []
    while i > 0:
        _, parent, key, _ = seen[i]
        keys.append(key)
        i = parent
    path = root
    for key in reversed(keys):
        if isinstance(key, _KeyOf):
            path += f" key {key.key!r}"
        elif isinstance(key, int):
            path += f"[{key}]"
        else:
            path += f"[{key!r}]"
    raise NotSerializable(task, path, value, why)


def now() -> float:
    return time.time()


#: Longest task name a message may carry.
MAX_TASK_NAME = 255


def check_task_name(name: object) -> str:
    """Return ``name`` if a message may carry it as its task, else raise a clear error.

    Whether a worker knows the task is the worker's to decide (``--unknown-task-delay``).
    """
    if (
        not isinstance(name, str)
        or not 0 < len(name) <= MAX_TASK_NAME
        or not name.isprintable()
        or name != name.strip()
    ):
        raise PublishError(
            f"invalid task name {name!r}: expected a string of 1-{MAX_TASK_NAME} printable "
            "characters without leading or trailing spaces, e.g. 'billing.charge'"
        )
    return name


_QUEUE_NAME = re.compile(r"^[A-Za-z0-9_.:\-]{1,80}$")


def check_queue_name(name: object) -> str:
    """Return ``name`` if it is a valid queue name, else raise a clear error."""
    if not isinstance(name, str) or not _QUEUE_NAME.match(name):
        raise PublishError(
            f"invalid queue name {name!r}: expected 1-80 characters of letters, digits, "
            "'_', '.', ':' or '-'"
        )
    return name
