"""What an app's options and its tasks' options need from its stores and its broker.

One check, called by the producer (when the app is made, when a task is declared, at the first
send) and by the worker at start, so that the two never disagree: a configuration a worker
would refuse is refused before anything is published (docs/configuration.md, "Where options
are checked").  It looks only at registries and at what the broker URL itself says: nothing
here connects anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ackwise.app._policy import check_hold_limit
from ackwise.contract._spi import BrokerURL, LeaseExtension, redact_url
from ackwise.errors import ConfigurationError

if TYPE_CHECKING:
    from ackwise.app._ports import AppPort
    from ackwise.app._task import Task, TaskApp

__all__ = ["check_app", "check_app_options", "check_task", "missing_store"]


@dataclass(frozen=True)
class _Store:
    """One kind of store an app may have: its App option and what it is called."""

    option: str  # the App(...) argument that gives its URL
    attribute: str  # the App attribute holding the URL in use
    noun: str  # "a result store"
    keeps: str  # what it keeps, for "cannot keep …"


#: By registry kind (:meth:`AdapterRegistry.store_schemes`).
_STORES = {
    "result": _Store("result_store", "result_store_url", "a result store", "results"),
    "idempotency": _Store(
        "idempotency_store", "idempotency_store_url", "an idempotency store", "idempotency keys"
    ),
    "rate limit": _Store(
        "rate_limit_store", "rate_limit_store_url", "a rate limit store", "shared rate limits"
    ),
    "worker registry": _Store(
        "worker_registry", "worker_registry_url", "a worker registry", "worker records"
    ),
}


def _schemes(app: TaskApp, kind: str) -> str:
    return ", ".join(app.plugins.adapters.store_schemes(kind))


def missing_store(app: TaskApp, kind: str, where: str, need: str) -> ConfigurationError:
    """The refusal of ``need`` (an option, as written) at ``where`` (``app 'x'``, ``task 'y'``)
    on an app that has no ``kind`` store: what is missing, why, and the option that gives one."""
    store = _STORES[kind]
    return ConfigurationError(
        f"{where}: {need} needs {store.noun}, and broker {app.broker} keeps no {store.keeps} "
        f"of its own; set App({store.option}=URL) with a URL of one of: {_schemes(app, kind)}"
    )


def check_app_options(app: AppPort) -> None:
    """Refuse an option of ``App(...)`` its stores cannot serve (called when the app is made).

    :raises ConfigurationError: a store URL of a scheme that has no such store, or
        ``store_results=True`` without a result store.
    """
    for kind, store in _STORES.items():
        url = getattr(app, store.attribute)
        if url is None:
            continue
        scheme = BrokerURL.parse(url).scheme.lower()
        if scheme not in app.plugins.adapters.store_schemes(kind):
            install = app.plugins.adapters.install_hint(scheme)
            raise ConfigurationError(
                f"app {app.name!r}: {store.option}={redact_url(url)!r} cannot keep "
                f"{store.keeps}: no installed plugin provides {store.noun} for {scheme}:// "
                f"URLs; give a URL of one of: {_schemes(app, kind)}"
                + (f", or {install}" if install else "")
            )
    if app.store_results and app.result_store_url is None:
        raise missing_store(app, "result", f"app {app.name!r}", "store_results=True")


def check_task(app: AppPort, task: Task[..., Any]) -> None:
    """Refuse an option of ``task`` the app's stores or broker cannot serve (called when the
    task is declared).

    :raises ConfigurationError: one line naming the task, the option and the fix.
    """
    where = f"task {task.name!r}"
    if task.store_results and app.result_store_url is None:
        raise missing_store(app, "result", where, "store_results=True")
    if task.track_started and not task.store_results:
        raise ConfigurationError(
            f"{where}: track_started=True records its start in the result store, but the "
            "task stores no results; set store_results=True on it (or App(store_results="
            "True)), or drop track_started"
        )
    if task.rate_interval is not None and app.rate_limit_store_url is None:
        raise missing_store(app, "rate limit", where, f"rate_limit={task.rate_limit!r}")
    if task.idempotency_key is not None and app.idempotency_store_url is None:
        raise missing_store(app, "idempotency", where, "idempotency_key")
    if (
        task.time_limit is None
        and app.adapter_class.capabilities.lease_extension is LeaseExtension.NONE
    ):
        raise ConfigurationError(
            f"{where}: broker {app.broker} cannot extend leases, and the task has no "
            "time_limit, so it may outlive its delivery's lease; give it a time_limit within "
            "the workers' --lease"
        )
    if task.time_limit is not None:
        # The instance's capabilities: RabbitMQ's URL says its consumer_timeout.
        limit = app.capabilities.max_hold
        if limit is not None:
            check_hold_limit([task], limit)


def check_app(app: AppPort) -> None:
    """Refuse what :func:`check_app_options` and :func:`check_task` refuse, for the app and
    every task it has now: a worker's check at start, and a producer's at its first send
    (so an app changed after it was made is refused there, not by the worker)."""
    check_app_options(app)
    for task in app.tasks.values():
        check_task(app, task)
