"""The dashboard's pages (Starlette, server-rendered Jinja2 templates; no JavaScript needed).

``/`` queues and workers; ``/workers``; ``/dead`` the dead letters, filtered and paged;
``/dead/<queue>/<id>`` one in full; replay and purge go through a confirmation page and are
POSTs carrying the CSRF token, refused in read-only mode.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from ackwise.app._app import App
from ackwise.contract._spi import redact_url
from ackwise.dashboard.data import Source, age
from ackwise.dashboard.history import EVERY, History, sparkline
from ackwise.dashboard.security import Csrf, TokenGuard
from ackwise.errors import AckwiseError

__all__ = ["create_app"]

log = logging.getLogger("ackwise.dashboard")

_TEMPLATES = Environment(
    loader=FileSystemLoader(Path(__file__).parent / "templates"),
    autoescape=select_autoescape(["html"]),
)
_TEMPLATES.filters["age"] = age
_ACTIONS = ("replay", "purge")


def create_app(app: App, *, token: str | None = None, read_only: bool = False) -> Any:
    """The dashboard of ``app`` as an ASGI application.

    :param token: required of every request (bearer token or basic-auth password) when set.
    :param read_only: no replay or purge: their buttons are hidden and their POSTs refused.
    """
    source = Source(app)
    csrf = Csrf()
    history = History()

    def page(name: str, request: Request, status: int = 200, **values: Any) -> HTMLResponse:
        html = _TEMPLATES.get_template(name).render(
            app=app,
            broker=redact_url(app.broker_url),
            read_only=read_only,
            csrf=csrf.token,
            path=request.url.path,
            now=time.time(),
            **values,
        )
        return HTMLResponse(html, status_code=status)

    async def overview(request: Request) -> Response:
        stats, workers, unknown = source.stats(), source.workers(), source.unknown()
        if history.due():
            history.add(stats, workers, unknown)
        charts = {
            q.queue: (
                Markup(sparkline(history.depth(q.queue))),
                Markup(sparkline(history.throughput(q.queue))),
                Markup(sparkline(history.failure_rate(q.queue))),
            )
            for q in stats
        }
        done, failed = history.throughput(), history.failure_rate()
        return page(
            "overview.html",
            request,
            stats=stats,
            unknown=unknown,
            workers=workers,
            charts=charts,
            throughput=Markup(sparkline(done)),
            failures=Markup(sparkline(failed)),
            rate=done[-1] if done else None,
            failing=failed[-1] if failed else None,
            recent=source.recent_dead(10),
        )

    async def workers(request: Request) -> Response:
        return page("workers.html", request, workers=source.workers())

    def _selection(params: Any) -> dict[str, Any]:
        queue = str(params.get("queue") or "")
        return {
            "queue": queue,
            "reason": str(params.get("reason") or ""),
            "task": str(params.get("task") or ""),
            "queues": [queue] if queue else source.queues(),
        }

    async def dead(request: Request) -> Response:
        sel = _selection(request.query_params)
        try:
            number = int(request.query_params.get("page", "1"))
        except ValueError:
            number = 1
        found = source.dead(sel["queues"], reason=sel["reason"], task=sel["task"], page=number)
        return page(
            "dead.html",
            request,
            found=found,
            all_queues=source.queues(),
            done=request.query_params.get("done", ""),
            **{k: v for k, v in sel.items() if k != "queues"},
        )

    async def dead_letter(request: Request) -> Response:
        queue, mid = request.path_params["queue"], request.path_params["message_id"]
        entry = source.dead_letter(queue, mid)
        if entry is None:
            return page("message.html", request, 404, message=f"no dead letter {mid} in {queue}")
        return page("entry.html", request, e=entry.as_dict(full=True))

    async def confirm(request: Request) -> Response:
        """The confirmation page of a replay or purge (nothing changes here)."""
        form = await request.form()
        refused = _refused(form)
        if refused is not None:
            return page("message.html", request, 403, message=refused)
        action = str(form.get("action"))
        picked = _picked(form)
        return page("confirm.html", request, action=action, picked=picked)

    async def act(request: Request) -> Response:
        """Replay or purge the dead letters the confirmation page listed."""
        form = await request.form()
        refused = _refused(form)
        if refused is not None or form.get("confirmed") != "yes":
            return page("message.html", request, 403, message=refused or "not confirmed")
        action = str(form.get("action"))
        by_queue: dict[str, list[str]] = {}
        for queue, mid in _picked(form):
            by_queue.setdefault(queue, []).append(mid)
        adapter = source.adapter
        if action == "replay":
            done = sum(adapter.requeue_dead(q, sorted(set(ids))) for q, ids in by_queue.items())
        else:
            done = sum(adapter.delete_dead(q, sorted(set(ids))) for q, ids in by_queue.items())
        verb = "replayed" if action == "replay" else "deleted"
        return RedirectResponse(f"/dead?done={verb}+{done}", status_code=303)

    def _refused(form: Any) -> str | None:
        if read_only:
            return "this dashboard is read-only (--read-only)"
        if not csrf.valid(form.get("csrf")):
            return "the form's CSRF token is missing or wrong: reload the page and try again"
        if form.get("action") not in _ACTIONS:
            return f"unknown action {form.get('action')!r}: expected replay or purge"
        return None

    routes = [
        Route("/", overview),
        Route("/workers", workers),
        Route("/dead", dead),
        Route("/dead/confirm", confirm, methods=["POST"]),
        Route("/dead/act", act, methods=["POST"]),
        Route("/dead/{queue}/{message_id}", dead_letter),
    ]

    async def sample() -> None:
        """Sample every EVERY seconds while the dashboard runs, viewed or not."""
        while True:
            await asyncio.sleep(EVERY)
            if history.due():
                try:
                    history.add(source.stats(), source.workers(), source.unknown())
                except AckwiseError as exc:  # the broker is away: a gap, not a crash
                    log.warning("dashboard: sampling the queues failed: %s", exc)

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        sampler = asyncio.get_running_loop().create_task(sample())
        try:
            yield
        finally:
            sampler.cancel()
            source.close()

    web = Starlette(routes=routes, lifespan=lifespan)
    return TokenGuard(web, token) if token else web


def _picked(form: Any) -> list[tuple[str, str]]:
    """The ``queue/id`` pairs a form names (its ``pick`` fields)."""
    out = []
    for value in form.getlist("pick"):
        queue, sep, mid = str(value).rpartition("/")
        if sep and queue and mid:
            out.append((queue, mid))
    return out
