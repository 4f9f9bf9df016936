"""Dead letters as the operator sees them (``ackwise dlq``, the dashboard): each with its
decoded envelope."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ackwise.contract import _envelope
from ackwise.contract._spi import DeadLetter
from ackwise.errors import EnvelopeError

__all__ = ["SCAN_LIMIT", "Entry"]

#: How many dead letters per queue one command looks at.
SCAN_LIMIT = 100_000


@dataclass
class Entry:
    """A dead letter with its decoded envelope (when the body is one)."""

    dead: DeadLetter
    envelope: _envelope.Envelope | None

    @classmethod
    def of(cls, dead: DeadLetter) -> Entry:
        """``dead`` with its envelope decoded, or ``None`` where its body is not one."""
        try:
            env: _envelope.Envelope | None = _envelope.decode(dead.body)
        except EnvelopeError:
            env = None
        return cls(dead, env)

    @property
    def task(self) -> str | None:
        return self.envelope.task if self.envelope else None

    @property
    def last_error(self) -> str | None:
        if self.envelope and self.envelope.history:
            return self.envelope.history[-1].error
        return None

    def as_dict(self, *, full: bool = False) -> dict[str, Any]:
        d = self.dead
        out: dict[str, Any] = {
            "queue": d.queue,
            "id": d.message_id,
            "task": self.task,
            "reason": d.reason,
            "dead_at": d.dead_at,
            "age": round(max(0.0, time.time() - d.dead_at), 3),
            "attempts": len(self.envelope.history) if self.envelope else d.attempt,
            "last_error": self.last_error,
        }
        if full:
            if self.envelope is not None:
                env = self.envelope
                out["envelope"] = {
                    "v": env.v,
                    "task": env.task,
                    "args": env.args,
                    "kwargs": env.kwargs,
                    "queue": env.queue,
                    "created_at": env.created_at,
                    "eta": env.eta,
                    "headers": env.headers,
                    "history": [
                        {
                            k: getattr(h, k)
                            for k in ("attempt", "at", "outcome", "error", "traceback", "worker")
                        }
                        for h in env.history
                    ],
                }
            else:
                out["body"] = d.body.decode("utf-8", "backslashreplace")
        return out
