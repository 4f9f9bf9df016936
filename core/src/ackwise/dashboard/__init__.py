"""``ackwise dashboard``: a small web page of an app's queues, workers and dead letters, with
replay and purge (docs/dashboard.md).  Needs the ``dashboard`` extra (Starlette, Jinja2,
uvicorn); nothing here is imported by the rest of ackwise."""

from ackwise.dashboard.web import create_app

__all__ = ["create_app"]
