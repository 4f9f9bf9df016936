"""The checker (after Jepsen's queue checker): classify every message after a scenario.

After the fault, the harness heals and drains; then every published message is one of

``ok``          ran to completion exactly once
``duplicated``  ran to completion more than once
``dead``        is in the dead-letter store (with a reason)
``lost``        published ok, never completed, not dead-lettered
``unexpected``  completed but never published

and the broker's own ``stats()`` is cross-checked: nothing left ready or in flight.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Protocol

from ackwise import Ack, DeadLetter, QueueStats
from ackwise_conformance.journal import Journal
from ackwise_conformance.verdicts import ScenarioFailed

__all__ = ["CheckedCase", "History", "MessageFate"]


class CheckedCase(Protocol):
    """What the checker reads of a case: a :class:`~ackwise_conformance.harness.Harness`."""

    @property
    def mode(self) -> Ack: ...

    @property
    def journal(self) -> Journal: ...

    @property
    def published(self) -> dict[str, str]: ...  # message id -> key, of every one published

    @property
    def counts_in_flight(self) -> bool: ...

    def stats(self) -> QueueStats: ...

    def dead_letters(self) -> list[DeadLetter]: ...


@dataclass
class MessageFate:
    id: str
    key: str | None
    published: bool
    starts: list[dict[str, Any]] = field(default_factory=list)
    ends: list[dict[str, Any]] = field(default_factory=list)
    dead: list[DeadLetter] = field(default_factory=list)

    @property
    def status(self) -> str:
        if not self.published:
            return "unexpected"
        if self.dead:
            return "dead"
        if not self.ends:
            return "lost"
        return "ok" if len(self.ends) == 1 else "duplicated"

    @property
    def executions(self) -> int:
        return len(self.starts)


@dataclass
class History:
    harness: CheckedCase
    fates: dict[str, MessageFate]

    @classmethod
    def build(cls, harness: CheckedCase) -> History:
        fates: dict[str, MessageFate] = {}
        for mid, key in harness.published.items():
            fates[mid] = MessageFate(mid, key, True)
        by_id: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for rec in harness.journal.records():
            if rec.get("id") and rec["ev"] in ("start", "end"):
                by_id[rec["id"]].append(rec)
        for mid, recs in by_id.items():
            fate = fates.get(mid) or fates.setdefault(
                mid, MessageFate(mid, recs[0].get("key"), False)
            )
            fate.starts = [r for r in recs if r["ev"] == "start"]
            fate.ends = [r for r in recs if r["ev"] == "end"]
        for dead in harness.dead_letters():
            if dead.message_id not in fates:
                fates[dead.message_id] = MessageFate(dead.message_id, None, False)
            fates[dead.message_id].dead.append(dead)
        return cls(harness, fates)

    # -- reading ---------------------------------------------------------------------------
    def by_key(self, key: str) -> MessageFate:
        matches = [f for f in self.fates.values() if f.key == key]
        if len(matches) != 1:
            self.fail(f"expected one message with key {key!r}, found {len(matches)}")
        return matches[0]

    def count(self, status: str) -> int:
        return sum(1 for f in self.fates.values() if f.status == status)

    def summary(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for f in self.fates.values():
            out[f.status] += 1
        return dict(out)

    # -- expectations ----------------------------------------------------------------------
    def fail(self, message: str, *fates: MessageFate) -> None:
        """Raise :class:`ScenarioFailed` with ``message`` and the journal lines of ``fates``."""
        details = ""
        for fate in fates[:5]:
            lines = self.harness.journal.lines_for(fate.id)
            # The dead-letter reason goes in the first line: a long report is often shown cut.
            dead = "; ".join(f"{d.reason}, attempt {d.attempt}" for d in fate.dead)
            why = f" (dead-lettered: {dead})" if dead else ""
            details += (
                f"\n  message {fate.id} (key {fate.key}): status {fate.status}{why}, "
                f"{fate.executions} execution(s)\n    "
                + "\n    ".join(lines or ["(no journal lines)"])
            )
        if len(fates) > 5:
            details += f"\n  … and {len(fates) - 5} more"
        diagnosis = _diagnose(fates[0], self.harness.mode) if fates else None
        head = f"{diagnosis}\n" if diagnosis else ""
        raise ScenarioFailed(f"{head}{message}; summary {self.summary()}{details}")

    def expect_no_unexpected(self) -> None:
        bad = [f for f in self.fates.values() if f.status == "unexpected"]
        if bad:
            self.fail("messages completed that were never published", *bad)

    def expect_ok_once(self, keys: list[str] | None = None) -> None:
        """Each message (or those with ``keys``) ran to completion exactly once."""
        fates = self._select(keys)
        bad = [f for f in fates if f.status != "ok"]
        if bad:
            self.fail("expected every message to complete exactly once", *bad)

    def expect_first_deliveries(self) -> None:
        """Nothing failed, so nothing came back: every execution ran a first delivery."""
        bad = [f for f in self.fates.values() if any(s.get("attempt") != 1 for s in f.starts)]
        if bad:
            self.fail(f"{len(bad)} message(s) were delivered again although nothing failed", *bad)

    def expect_completed(
        self, keys: list[str] | None = None, *, max_dup: int | None = None
    ) -> None:
        """At least once: each completed; with ``max_dup``, at most that many extra completions."""
        fates = self._select(keys)
        lost = [f for f in fates if not f.ends]
        if lost:
            self.fail("expected every message to complete at least once; some were lost", *lost)
        if max_dup is not None:
            extra = sum(len(f.ends) - 1 for f in fates)
            if extra > max_dup:
                dups = [f for f in fates if len(f.ends) > 1]
                self.fail(f"expected at most {max_dup} duplicate completion(s), got {extra}", *dups)

    def expect_no_duplicates(self, keys: list[str] | None = None) -> None:
        bad = [f for f in self._select(keys) if len(f.starts) > 1 or len(f.ends) > 1]
        if bad:
            self.fail("expected no message to run more than once", *bad)

    def expect_lost(self, key: str) -> None:
        fate = self.by_key(key)
        if fate.ends or fate.dead:
            self.fail(f"expected message {key} to be lost (at most once)", fate)

    def expect_dead(self, key: str, reason: str, *, executions: int | None = None) -> None:
        fate = self.by_key(key)
        if not fate.dead or fate.dead[0].reason != reason:
            self.fail(f"expected message {key} dead-lettered with reason {reason!r}", fate)
        if executions is not None and fate.executions != executions:
            self.fail(
                f"expected message {key} to run {executions} time(s) before its dead letter, "
                f"ran {fate.executions}",
                fate,
            )

    def expect_broker_settled(self, *, dead: int | None = None) -> None:
        """The broker's own view agrees: nothing ready, delayed or in flight; ``dead`` dead.

        Where the broker cannot count what the workers hold (``global_in_flight=False``) the
        in-flight count is not compared: it would only count the suite's own connection.
        """
        st = self.harness.stats()
        in_flight = st.in_flight if self.harness.counts_in_flight else 0
        if st.ready or in_flight or st.delayed:
            self.fail(f"the broker still holds messages: {st}")
        if dead is not None and st.dead != dead:
            self.fail(f"the broker counts {st.dead} dead letter(s), expected {dead}")

    def _select(self, keys: list[str] | None) -> list[MessageFate]:
        if keys is None:
            return [f for f in self.fates.values() if f.published]
        wanted = set(keys)
        return [f for f in self.fates.values() if f.key in wanted]


def _diagnose(fate: MessageFate, mode: Ack | None) -> str | None:
    """Which guarantee the journal shows broken for ``fate``, in words (None: nothing plain).

    The workload journals a task's start and its end; a late ack follows the end, an early ack
    comes before the start.  So a delivery after an ended execution means the late ack did
    not remove the message, and a second start in early mode that the early ack did not.
    """
    if not fate.published:
        return f"message {fate.id} ran but was never published: the broker made it up"
    attempts = [s.get("attempt") for s in fate.starts]
    if mode is Ack.EARLY and len(fate.starts) > 1:
        return (
            f"the early ack did not remove message {fate.id}: it ran {len(fate.starts)} times "
            f"(attempts {attempts}) although ack_before_start had returned before the first run"
        )
    if fate.ends and (len(fate.starts) > len(fate.ends) or len(fate.ends) > 1 or fate.dead):
        first_end = min(e["t"] for e in fate.ends)
        later = [s for s in fate.starts if s["t"] > first_end]
        if later:
            after = f", then dead-lettered ({fate.dead[0].reason})" if fate.dead else ""
            return (
                f"ack did not remove message {fate.id}: it was delivered again (attempt "
                f"{later[0].get('attempt')}) after its task had completed{after}"
            )
    if fate.status == "lost":
        if not fate.starts:
            return f"message {fate.id} was lost: published, never delivered, not dead-lettered"
        return (
            f"message {fate.id} was lost: delivered (attempts {attempts}), never completed, "
            "and neither delivered again nor dead-lettered"
        )
    if fate.dead and not fate.ends:
        return (
            f"message {fate.id} was dead-lettered ({fate.dead[0].reason}, attempt "
            f"{fate.dead[0].attempt}) without completing"
        )
    return None
