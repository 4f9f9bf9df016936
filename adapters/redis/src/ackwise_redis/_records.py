"""What the data records and the scripts' replies hold, read without trusting them.

Framing a message for its data record, reading a delivery or a dead letter back from a reply
(a record that cannot be read becomes a corrupt delivery, with a stand-in id), and the enqueue
time a seq carries.  See the adapter's overview (:mod:`ackwise_redis._adapter`): Corrupt storage.
"""

from __future__ import annotations

import re

from ackwise.spi import DeadLetter, Delivery, Outgoing


def _pack(m: Outgoing) -> bytes:
    """A message's data record: ``<len(id)>:<id><body>``."""
    mid = m.id.encode()
    return b"%d:%s%s" % (len(mid), mid, m.body)


# -- records ackwise did not write ---------------------------------------------------------
#: Digits a data value's id length may have (ids are far shorter than a billion bytes).
_LEN_DIGITS = 9
#: Where receive.lua found an entry it could not read, by the ``<where>`` of its stand-in seq.
_STAND_IN = re.compile(rb"[0-9a-f]+-(ready|urgent|delayed|inflight|nodata)\.")
_ENTRY_PROBLEMS = {
    b"ready": "ready entry %s is not <seq>#<n>",
    b"urgent": "urgent entry %s is not <seq>#<n>",
    b"delayed": "delayed entry %s is not <seq>#<n>",
    b"inflight": "in-flight entry %s is not <seq>#<n>#<token>",
    b"nodata": "entry %s has no data record",
}


def _framed(data: object) -> tuple[str, bytes] | None:
    """(id, body) of a data value ``<len(id)>:<id><body>``, or None when it is not one."""
    if type(data) is not bytes:
        return None
    colon = data.find(b":", 0, _LEN_DIGITS + 1)
    if colon < 1 or not data[:colon].isdigit():
        return None
    end = colon + 1 + int(data[:colon])
    if end == colon + 1 or end > len(data):
        return None
    try:
        return data[colon + 1 : end].decode(), data[end:]
    except UnicodeDecodeError:
        return None


def _framing_problem(data: bytes) -> str:
    colon = data.find(b":", 0, _LEN_DIGITS + 1)
    if colon < 1 or not data[:colon].isdigit():
        return "no <len>: prefix"
    length = int(data[:colon])
    if length == 0:
        return "the message id is empty"
    if colon + 1 + length > len(data):
        return f"an id of {length} bytes runs past the end of its {len(data)} bytes"
    return "the message id is not UTF-8"


def _show(raw: bytes) -> str:
    return repr(raw[:60]) + ("..." if len(raw) > 60 else "")


def _stand_in_id(seq: bytes) -> str:
    return "corrupt-" + seq.decode("utf-8", "backslashreplace")


def _unreadable(seq: bytes, data: object) -> tuple[str, bytes]:
    """What is wrong with a data record that is not framed, and the bytes its dead letter keeps.

    A stand-in record of receive.lua (``"0:" + raw entry``) keeps the raw entry; any other
    keeps the whole data value.
    """
    if type(data) is not bytes:
        return f"data record {_show(seq)} is missing", b""
    stand_in = _STAND_IN.match(seq)
    if stand_in is not None and data.startswith(b"0:"):
        return _ENTRY_PROBLEMS[stand_in.group(1)] % _show(data[2:]), data[2:]
    return f"data record {_show(seq)} is not <len>:<id><body>: {_framing_problem(data)}", data


def _delivery(queue: str, member: bytes, data: object, deadline: float) -> Delivery:
    """One delivery of a receive reply; a record that cannot be read becomes a corrupt one."""
    seq, _, rest = member.partition(b"#")
    count = rest.partition(b"#")[0]
    attempt = int(count) if count.isdigit() and len(count) <= _LEN_DIGITS + 1 else 1
    record = _framed(data)
    if record is not None:
        return Delivery(queue, record[0], record[1], member, attempt, deadline)
    problem, raw = _unreadable(seq, data)
    return Delivery(queue, _stand_in_id(seq), raw, member, attempt, deadline, corrupt=problem)


def _dead_letter_of(
    queue: str, seq: bytes, dead_at: object, data: object, info: object
) -> DeadLetter:
    """A dead letter as stored, whatever its data and info hold."""
    record = _framed(data)
    if record is None:
        mid, body = _stand_in_id(seq), data if type(data) is bytes else b""
    else:
        mid, body = record
    attempt, reason = 0, "unknown"
    if type(info) is bytes:
        count, _, text = info.partition(b"|")
        attempt = int(count) if count.isdigit() and len(count) <= 18 else 0
        reason = text.decode("utf-8", "replace") or "unknown"
    return DeadLetter(queue, mid, body, reason, _number(dead_at), attempt)


def _number(value: object) -> float:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 0.0


def _seq_time(entry: bytes) -> float | None:
    """Enqueue time (server clock, seconds) carried by a seq or an entry that starts with one."""
    head = entry.split(b"-", 1)[0]
    if not 0 < len(head) <= 12:  # 12 hex digits of milliseconds: beyond the year 10000
        return None
    try:
        return int(head, 16) / 1000.0
    except ValueError:
        return None
