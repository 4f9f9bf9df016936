"""``ackwise dlq``: list, show, replay and purge dead letters."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from ackwise.app._deadletters import SCAN_LIMIT, Entry
from ackwise.cli._common import BROKER_HELP
from ackwise.contract._spi import Adapter
from ackwise.errors import AckwiseError


def add_parser(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "dlq",
        help="list, show, replay or purge dead letters",
        description="Inspect and act on dead-lettered messages.",
    )
    actions = p.add_subparsers(dest="dlq_action", required=True, metavar="ACTION")

    def common(a: argparse.ArgumentParser) -> None:
        a.add_argument(
            "app", metavar="MODULE:APP", nargs="?", help="App whose broker and queues to use"
        )
        a.add_argument("--broker", metavar="URL", help=BROKER_HELP)
        a.add_argument(
            "-Q",
            "--queues",
            default="",
            help="comma-separated queues (default: the app's, else every queue the broker lists)",
        )
        a.add_argument("--task", help="only dead letters of this task")
        a.add_argument("--reason", help="only this reason (failed, worker_lost, max_deliveries, …)")
        a.add_argument(
            "--older-than", type=float, metavar="SECONDS", help="dead for at least this long"
        )
        a.add_argument(
            "--newer-than", type=float, metavar="SECONDS", help="dead for at most this long"
        )
        a.add_argument(
            "--id", action="append", default=[], help="only this message id (repeatable)"
        )

    ls = actions.add_parser("list", help="list dead letters")
    common(ls)
    ls.add_argument("--limit", type=int, default=50, metavar="N", help="rows to print")
    ls.add_argument("--json", action="store_true", help="print JSON")
    show = actions.add_parser("show", help="show dead letters in full (body, history, tracebacks)")
    common(show)
    show.add_argument("--json", action="store_true", help="print JSON")
    rp = actions.add_parser("replay", help="publish dead letters to their queue again, once")
    common(rp)
    rp.add_argument("--all", action="store_true", help="replay every dead letter of the queues")
    pg = actions.add_parser("purge", help="delete dead letters for good")
    common(pg)
    pg.add_argument("--all", action="store_true", help="purge every dead letter of the queues")
    pg.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    p.set_defaults(func=run)


def _select(adapter: Adapter, queues: Sequence[str], args: argparse.Namespace) -> list[Entry]:
    now = time.time()
    wanted_ids = set(args.id)
    out: list[Entry] = []
    for q in queues:
        for dead in adapter.dead_letters(q, limit=SCAN_LIMIT):
            if wanted_ids and dead.message_id not in wanted_ids:
                continue
            if args.reason and dead.reason != args.reason:
                continue
            age = now - dead.dead_at
            if args.older_than is not None and age < args.older_than:
                continue
            if args.newer_than is not None and age > args.newer_than:
                continue
            entry = Entry.of(dead)
            if args.task and entry.task != args.task:
                continue
            out.append(entry)
    return out


def _has_filter(args: argparse.Namespace) -> bool:
    return bool(
        args.task
        or args.reason
        or args.id
        or args.older_than is not None
        or args.newer_than is not None
    )


def run(args: argparse.Namespace) -> int:
    from ackwise.cli._common import queues_or_all, resolve_broker, table
    from ackwise.plugins._manager import open_adapter

    broker, queues = resolve_broker(args)
    adapter = open_adapter(broker)
    adapter.open()
    try:
        queues = queues_or_all(adapter, broker, queues)
        action = args.dlq_action
        if action in ("replay", "purge") and not (_has_filter(args) or args.all):
            raise AckwiseError(
                f"dlq {action}: say which dead letters (--id, --task, --reason, --older-than, "
                "--newer-than) or --all"
            )
        entries = _select(adapter, queues, args)
        if action == "list":
            rows = entries[: args.limit]
            if args.json:
                print(json.dumps([e.as_dict() for e in rows], indent=2))
                return 0
            print(
                table(
                    ["queue", "id", "task", "reason", "age", "attempts", "last error"],
                    [
                        [
                            e.dead.queue,
                            e.dead.message_id,
                            e.task or "?",
                            e.dead.reason,
                            f"{max(0.0, time.time() - e.dead.dead_at):.0f}s",
                            e.as_dict()["attempts"],
                            (e.last_error or "")[:60],
                        ]
                        for e in rows
                    ],
                )
            )
            more = len(entries) - len(rows)
            print(
                f"{len(entries)} dead letter(s)"
                + (f", {more} not shown (--limit)" if more > 0 else "")
            )
            return 0
        if action == "show":
            if args.json:
                print(json.dumps([e.as_dict(full=True) for e in entries], indent=2))
                return 0
            for e in entries:
                _print_entry(e)
            if not entries:
                print("no dead letter matches")
            return 0
        by_queue: dict[str, list[str]] = {}
        for e in entries:
            by_queue.setdefault(e.dead.queue, []).append(e.dead.message_id)
        if not entries:
            print(f"no dead letter matches: nothing to {action}")
            return 0
        if action == "replay":
            total = sum(adapter.requeue_dead(q, sorted(set(ids))) for q, ids in by_queue.items())
            print(f"replayed {total} dead letter(s) to {', '.join(sorted(by_queue))}")
            return 0
        # purge
        summary = ", ".join(f"{len(ids)} from {q}" for q, ids in by_queue.items())
        if not args.yes:
            if not sys.stdin.isatty():
                raise AckwiseError(
                    f"dlq purge would delete {len(entries)} dead letter(s) ({summary}); "
                    "confirm with --yes (standard input is not a terminal)"
                )
            answer = input(f"Delete {len(entries)} dead letter(s) for good ({summary})? [y/N] ")
            if answer.strip().lower() not in ("y", "yes"):
                print("nothing deleted")
                return 1
        total = sum(adapter.delete_dead(q, sorted(set(ids))) for q, ids in by_queue.items())
        print(f"deleted {total} dead letter(s)")
        return 0
    finally:
        adapter.close()


def _print_entry(e: Entry) -> None:
    d = e.as_dict(full=True)
    print(f"message {d['id']}  queue {d['queue']}  reason {d['reason']}  dead {d['age']:.0f}s ago")
    env = d.get("envelope")
    if env is None:
        print(f"  body (not an envelope): {d['body'][:2000]}")
        print()
        return
    print(
        f"  task {env['task']}  args {json.dumps(env['args'])}  kwargs {json.dumps(env['kwargs'])}"
    )
    if env["headers"]:
        print(f"  headers {json.dumps(env['headers'])}")
    for h in env["history"]:
        print(
            f"  - delivery {h['attempt']}: {h['outcome']}"
            + (f": {h['error']}" if h["error"] else "")
        )
        if h["traceback"]:
            print("    " + h["traceback"].rstrip().replace("\n", "\n    "))
    print()
