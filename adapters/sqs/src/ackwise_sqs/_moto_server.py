"""moto's server, as the conformance suite runs it: ``python -m ackwise_sqs._moto_server``.

Started by this package's provisioner (``_provision``) for the suite and the benchmarks; it
needs ``moto[server]`` (a test dependency, not one of this package's), and nothing in the
adapter imports it.  The same arguments as ``moto_server``.  Two kinds of change, both applied by :func:`patch`
(``ACKWISE_MOTO_BOOKKEEPING=stock`` in the environment leaves out the second):

**Atomic receives** (a known emulator deviation): moto 5.2's server is threaded and its SQS
``ReceiveMessage`` is not atomic, so two concurrent receives can both take the same visible
message (both get it, with receive counts 1 and 2, within milliseconds).  SQS hands a message
to one receiver per visibility timeout (standard queues may, rarely, deliver a copy twice; never
two receivers racing as a rule).  Here every SQS operation that reads or changes messages runs
under one lock; a long poll waits *outside* the lock, polling every 0.1 s, so one waiting
receiver does not stall the others.

**Bookkeeping whose cost does not grow with the queue** (speed only: the same answers).  Stock
moto recomputes every queue attribute, with three scans of all the queue's messages, for each
message it receives (the retention check reads ``MessageRetentionPeriod`` through
``get_queue_attributes``, which builds the attribute dict three times) and for each message it
sends; it reads the clock twice per message per scan, and scans the queue twice, building a
list of receipt handles per message, to delete one message.  At 1,000 messages a receive of 10
took ~0.5 s, so the figures of a run measured moto's queue depth more than the client (real SQS
does not slow down with depth).  The replacements read the clock once per scan and the
retention period directly, compare handles in place, and find a message to delete by its
handle (moto's own scan where the index cannot vouch for a handle).  moto's request routing
lists its package directory and tries its URL patterns for every request: the answers depend
on the host alone and are kept.  moto also keeps every queue and message it ever created, deleted or
not, for its dashboard (``/moto-api/data.json``): a server process held ~40,000 messages after
one crash class, and each full garbage collection walked them all (0.15 s of CPU, seconds of
wall time on a loaded host, every request waiting: CI saw the renewals of two crash cases go
stale in the same second).  Queues and messages are not tracked here (the dashboard lists
none); moto's modules are frozen out of the collector once loaded.  Each other replacement keeps the original's answer;
``adapters/sqs/tests/test_moto_server.py`` checks them against moto's own code (:data:`ORIGINALS`) on
generated queues at frozen clocks.
"""

from __future__ import annotations

import functools
import gc
import os
import threading
import time
import weakref
from typing import Any

from moto import backends
from moto.moto_server.werkzeug_app import DomainDispatcherApplication
from moto.server import main
from moto.sqs import models
from moto.sqs.models import Message, Queue, SQSBackend

__all__ = ["ORIGINALS", "patch", "replacements"]

_LOCK = threading.RLock()
_POLL = 0.1
_LOCKED = (
    "send_message",
    "send_message_batch",
    "delete_message",
    "delete_message_batch",
    "change_message_visibility",
    "change_message_visibility_batch",
    "purge_queue",
    "get_queue_attributes",
)

#: moto's own implementations of what :func:`patch` replaces, by ``"Class.name"`` (read at
#: import, before any patch).
ORIGINALS: dict[str, Any] = {
    "backends.list_of_moto_modules": backends.list_of_moto_modules,
    "DomainDispatcherApplication.get_backend_for_host": (
        DomainDispatcherApplication.get_backend_for_host
    ),
}


def _locked(method: Any) -> Any:
    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        with _LOCK:
            return method(*args, **kwargs)

    return call


# -- same answers, without a cost per message of the queue -------------------------------------
# moto's clock is models.unix_time / unix_time_millis (it follows freezegun): read once per scan.
_moto: Any = models  # its clock functions are not in its __all__


def _had_receipt_handle(self: Message, receipt_handle: str) -> bool:
    return receipt_handle == self.receipt_handle or receipt_handle in self._old_receipt_handles


# Every receipt handle a receive gave out, to its message (moto generates 185 random letters per
# handle: one message per handle).  Only a shortcut: a handle it cannot vouch for takes moto's
# own path.
_BY_HANDLE: weakref.WeakValueDictionary[str, Message] = weakref.WeakValueDictionary()


def _mark_received(self: Message, visibility_timeout: int | None = None) -> None:
    ORIGINALS["Message.mark_received"](self, visibility_timeout)
    _BY_HANDLE[str(self.receipt_handle)] = self


def _delete_message(self: Queue, receipt_handle: str) -> None:
    if receipt_handle in self.deleted_messages:
        return  # moto: deleting again succeeds
    m = _BY_HANDLE.get(receipt_handle)
    # `in` compares by identity (Message has no __eq__): one C-level pass, no call per message.
    if m is None or not m.had_receipt_handle(receipt_handle) or m not in self._messages:
        ORIGINALS["Queue.delete_message"](self, receipt_handle)  # moto's scan (or its error)
        return
    # What moto's scan does to the one message that had the handle.
    self.pending_messages.discard(m)
    self.deleted_messages.update(m.all_receipt_handles)  # type: ignore[arg-type]
    kept = list(self._messages)
    kept.remove(m)
    self._messages = kept


def _messages(self: Queue) -> list[Message]:
    now = _moto.unix_time_millis()
    return [m for m in self._messages if now > m.visible_at and not now < m.delayed_until]


def _approximate_number_of_messages(self: Queue) -> int:
    return len(_messages(self))


def _approximate_number_of_messages_delayed(self: Queue) -> int:
    now = _moto.unix_time_millis()
    return sum(1 for m in self._messages if now < m.delayed_until)


def _approximate_number_of_messages_not_visible(self: Queue) -> int:
    now = _moto.unix_time_millis()
    return sum(1 for m in self._messages if not now > m.visible_at)


def _is_message_valid_based_on_retention_period(
    self: SQSBackend, queue_name: str, message: Message
) -> bool:
    # moto's own reads queue.message_retention_period through get_queue_attributes.
    queue: Any = self.get_queue(queue_name)
    sent: Any = message.sent_timestamp
    retain_until = queue.message_retention_period + sent / 1000
    return bool(retain_until > _moto.unix_time())


# -- request routing: what moto works out anew for every request, from fixed inputs ----------
# The installed moto's service folders: moto lists its package directory (an isdir() per
# service, ~150) once or twice per request to route it.
@functools.cache
def _list_of_moto_modules() -> tuple[str, ...]:
    return tuple(ORIGINALS["backends.list_of_moto_modules"]())


def _get_backend_for_host(self: DomainDispatcherApplication, host: str | None) -> Any:
    # A function of the host alone (fixed URL patterns); each host is matched once.
    cache: dict[str | None, Any] = self.__dict__.setdefault("_ackwise_backends", {})
    if host not in cache:
        cache[host] = ORIGINALS["DomainDispatcherApplication.get_backend_for_host"](self, host)
    return cache[host]


_FAST: dict[str, tuple[type, str, Any]] = {
    "Message.had_receipt_handle": (Message, "had_receipt_handle", _had_receipt_handle),
    "Message.mark_received": (Message, "mark_received", _mark_received),
    "Queue.delete_message": (Queue, "delete_message", _delete_message),
    "Queue.messages": (Queue, "messages", property(_messages)),
    "Queue.approximate_number_of_messages": (
        Queue,
        "approximate_number_of_messages",
        property(_approximate_number_of_messages),
    ),
    "Queue.approximate_number_of_messages_delayed": (
        Queue,
        "approximate_number_of_messages_delayed",
        property(_approximate_number_of_messages_delayed),
    ),
    "Queue.approximate_number_of_messages_not_visible": (
        Queue,
        "approximate_number_of_messages_not_visible",
        property(_approximate_number_of_messages_not_visible),
    ),
    "SQSBackend.is_message_valid_based_on_retention_period": (
        SQSBackend,
        "is_message_valid_based_on_retention_period",
        _is_message_valid_based_on_retention_period,
    ),
}


ORIGINALS.update({key: cls.__dict__[name] for key, (cls, name, _) in _FAST.items()})


def _untracked(cls: type, *args: Any, **kwargs: Any) -> Any:
    # moto's BaseModel.__new__ without its append to cls.instances_tracked (kept for ever).
    return object.__new__(cls)


def replacements() -> list[tuple[str, Any, Any]]:
    """``(name, moto's own, the replacement)`` for each bookkeeping change, patched or not."""
    return [(key, ORIGINALS[key], fast) for key, (_, _, fast) in _FAST.items()]


def patch(*, bookkeeping: bool = True) -> None:
    """Make moto's SQS message operations atomic and their cost independent of queue depth.

    :param bookkeeping: also replace the bookkeeping (``False``: moto's own, whose cost grows
        with the queue's depth; the receives stay atomic).
    """
    receive = SQSBackend.receive_message
    if getattr(receive, "_ackwise_atomic", False):
        return
    if bookkeeping:
        for cls, name, fast in _FAST.values():
            setattr(cls, name, fast)
        for model in (Message, Queue):
            model.__new__ = _untracked  # type: ignore[method-assign]
        backends.list_of_moto_modules = _list_of_moto_modules
        DomainDispatcherApplication.get_backend_for_host = _get_backend_for_host  # type: ignore[method-assign]

    def receive_message(
        self: Any,
        queue_name: str,
        count: int,
        wait_seconds_timeout: int,
        visibility_timeout: int,
        message_attribute_names: list[str] | None = None,
    ) -> Any:
        deadline = time.monotonic() + (wait_seconds_timeout or 0)
        while True:
            with _LOCK:
                got = receive(
                    self, queue_name, count, 0, visibility_timeout, message_attribute_names
                )
            remaining = deadline - time.monotonic()
            if got or remaining <= 0:
                return got
            time.sleep(min(_POLL, remaining))

    receive_message._ackwise_atomic = True  # type: ignore[attr-defined]
    SQSBackend.receive_message = receive_message  # type: ignore[method-assign]
    for name in _LOCKED:
        setattr(SQSBackend, name, _locked(getattr(SQSBackend, name)))


if __name__ == "__main__":
    # ACKWISE_MOTO_BOOKKEEPING=stock: moto's own bookkeeping (bench/sqs.py --stock-moto).
    patch(bookkeeping=os.environ.get("ACKWISE_MOTO_BOOKKEEPING", "") != "stock")
    gc.freeze()  # moto's ~100,000 objects of modules: not walked by every full collection
    main()
