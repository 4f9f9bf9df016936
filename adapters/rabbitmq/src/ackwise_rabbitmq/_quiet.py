"""pika's log records of the failures it raises.

pika logs a failing connection at ERROR from four modules (six lines and a traceback for a
refused password) and then raises; ackwise maps what it raises and reports it once, in one
line with pika's detail (docs/observability.md, "Broker errors").  These records stay out of
the log unless the driver's log was asked for (the ``pika`` logger at INFO or lower:
``--driver-loglevel INFO``); pika's other warnings (a blocked connection, a returned message)
still show.
"""

from __future__ import annotations

import logging
import threading

__all__ = ["quiet_raised_errors"]

#: Logger -> the message templates it logs just before the error is raised (``None``: every
#: record of that logger is about a connection attempt or a lost stream, raised as well).
RAISED_ANYWAY: dict[str, frozenset[str] | None] = {
    "pika.adapters.utils.connection_workflow": None,
    "pika.adapters.utils.io_services_utils": None,
    "pika.adapters.base_connection": None,
    "pika.adapters.blocking_connection": frozenset(
        {
            "Connection workflow failed: %r",
            "Error in _create_connection().",
            "Unexpected connection close detected: %r",
        }
    ),
    "pika.connection": frozenset(
        {
            "Connection closed while authenticating indicating a probable authentication error",
            "Connection closed while tuning the connection indicating a probable permission "
            "error when accessing a virtual host",
            "Probably incompatible Protocol Versions",
        }
    ),
    "pika.channel": frozenset({"Received remote Channel.Close (%s): %r on %s"}),
}

_installed = False
_lock = threading.Lock()


class _RaisedAnyway(logging.Filter):
    def __init__(self, templates: frozenset[str] | None) -> None:
        super().__init__()
        self.templates = templates

    def filter(self, record: logging.LogRecord) -> bool:
        if logging.getLogger("pika").getEffectiveLevel() < logging.WARNING:
            return True  # the driver's own log was asked for: all of it
        return self.templates is not None and record.msg not in self.templates


def quiet_raised_errors() -> None:
    """Install the filters (once per process; called when a connection opens)."""
    global _installed
    with _lock:
        if _installed:
            return
        for name, templates in RAISED_ANYWAY.items():
            logging.getLogger(name).addFilter(_RaisedAnyway(templates))
        _installed = True
