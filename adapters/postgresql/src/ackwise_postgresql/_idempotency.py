"""The idempotency store in PostgreSQL (``postgresql://``, ``postgres://``;
docs/idempotency.md): table ``ackwise_idempotency``, made on first use in the connection's
schema."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from ackwise.spi import BrokerURL, ClaimResult, IdempotencyStore, KeyState
from ackwise_postgresql._link import StoreLink

__all__ = ["PostgresIdempotencyStore"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS ackwise_idempotency (
    key    text PRIMARY KEY,
    status text NOT NULL CHECK (status IN ('running', 'done')),
    holder text,
    until  double precision NOT NULL
)
"""


class PostgresIdempotencyStore(IdempotencyStore):
    """Keys in PostgreSQL (``postgresql://user@host/db``).

    The claim is one statement: ``INSERT … ON CONFLICT (key) DO UPDATE … WHERE`` the old
    claim's lease ran out, ``RETURNING`` the holder — the database serializes racing claims.
    """

    scheme = "postgresql"

    def __init__(self, url: BrokerURL, **kwargs: Any) -> None:
        super().__init__(url, **kwargs)
        self._link = StoreLink(url, "idempotency store", [_SCHEMA])
        self._exec = self._link.execute

    def open(self) -> None:
        self._link.open()

    def close(self) -> None:
        self._link.close()

    def claim(self, key: str, holder: str, lease: float) -> ClaimResult:
        now = time.time()
        row = self._exec(
            "INSERT INTO ackwise_idempotency AS k (key, status, holder, until) "
            "VALUES (%s, 'running', %s, %s) ON CONFLICT (key) DO UPDATE SET "
            "status = 'running', holder = excluded.holder, until = excluded.until "
            "WHERE k.until <= %s RETURNING holder",
            (key, holder, now + lease, now),
        ).fetchone()
        if row is not None and row[0] == holder:
            return ClaimResult(KeyState.RUN)
        row = self._exec(
            "SELECT status, until FROM ackwise_idempotency WHERE key = %s", (key,)
        ).fetchone()
        if row is None:  # deleted between the two statements: try again once
            return self.claim(key, holder, lease)
        if row[0] == "done":
            return ClaimResult(KeyState.DONE)
        return ClaimResult(KeyState.BUSY, max(0.0, row[1] - now))

    def extend(self, claims: Sequence[tuple[str, str]], lease: float) -> None:
        until = time.time() + lease
        for key, holder in claims:
            self._exec(
                "UPDATE ackwise_idempotency SET until = %s "
                "WHERE key = %s AND holder = %s AND status = 'running'",
                (until, key, holder),
            )

    def complete(self, key: str, holder: str) -> None:
        self._exec(
            "UPDATE ackwise_idempotency SET status = 'done', holder = NULL, until = %s "
            "WHERE key = %s",
            (time.time() + self.done_ttl, key),
        )

    def release(self, key: str, holder: str) -> None:
        self._exec(
            "DELETE FROM ackwise_idempotency WHERE key = %s AND holder = %s AND status = 'running'",
            (key, holder),
        )

    def forget(self, keys: Sequence[str]) -> None:
        for key in keys:
            self._exec("DELETE FROM ackwise_idempotency WHERE key = %s", (key,))
