"""The Huey side of the embedded benchmark: one SqliteHuey with one no-op task.

The consumer imports ``benchmod_huey.huey``; its database file comes from ``$HUEY_BENCH_DB``.
``$HUEY_BENCH_SYNC=normal`` (what ``bench/embedded.py`` uses) sets ``PRAGMA synchronous=NORMAL``
on Huey's connections, the same durability as ackwise's ``sqlite://`` default (WAL, no fsync
per commit); ``default`` keeps Huey's own default (SQLite's ``FULL``: an fsync per commit).
"""

from __future__ import annotations

import os

import startlog
from huey import SqliteHuey
from huey.storage import SqliteStorage


class NormalSyncStorage(SqliteStorage):
    # Huey's own (private) connection hook: its ``fsync`` option sets only FULL or OFF, not NORMAL.
    def _create_connection(self):  # type: ignore[no-untyped-def]
        conn = super()._create_connection()
        conn.execute("PRAGMA synchronous=NORMAL")
        return conn


def make_huey(filename: str, sync: str = "normal") -> SqliteHuey:
    kwargs = {"storage_class": NormalSyncStorage} if sync == "normal" else {}
    huey = SqliteHuey("bench", filename=filename, **kwargs)

    @huey.task()
    def noop() -> None:
        startlog.mark()

    huey.bench_noop = noop  # type: ignore[attr-defined]
    return huey


_instance: SqliteHuey | None = None


def __getattr__(name: str) -> SqliteHuey:
    # ``benchmod_huey.huey`` is built on first access, so importing make_huey creates no file.
    global _instance
    if name != "huey":
        raise AttributeError(name)
    if _instance is None:
        _instance = make_huey(
            os.environ["HUEY_BENCH_DB"], os.environ.get("HUEY_BENCH_SYNC", "normal")
        )
    return _instance
