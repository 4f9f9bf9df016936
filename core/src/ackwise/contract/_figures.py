"""Which figures of a queue's :class:`~ackwise.QueueStats` a broker cannot report, and why.

One decision for every place that shows them: ``ackwise stats`` prints ``n/a`` (JSON
``null``), ``/metrics`` exports no sample, the dashboard shows "—" with the reason.  A 0 there
would read as "nothing there".
"""

from __future__ import annotations

from ackwise.contract._spi import Capabilities

__all__ = ["UNKNOWN_WHY", "unknown_figures"]

#: Why each figure can be unknown, in words (the dashboard's tooltip and footnote).
UNKNOWN_WHY = {
    "in_flight": "the broker counts only the unsettled messages of the connection that asks, "
    "not those of the workers (RabbitMQ without its management plugin)",
    "oldest_age": "the broker does not report how long its oldest message has waited "
    "(SQS: only in CloudWatch; RabbitMQ)",
}


def unknown_figures(capabilities: Capabilities) -> dict[str, str]:
    """The figures of :class:`QueueStats` (by field name) that a broker with ``capabilities``
    cannot know, each with why (:data:`UNKNOWN_WHY`); empty when it knows them all:

    - ``oldest_age`` where ``oldest_age=False`` (SQS has it only in CloudWatch; RabbitMQ);
    - ``in_flight`` where ``global_in_flight=False``: the broker counts only this connection's
      deliveries, and a reader's connection holds none (RabbitMQ without its management API).

    Pass the capabilities of the opened adapter: a URL option may change them.
    """
    unknown: dict[str, str] = {}
    if not capabilities.global_in_flight:
        unknown["in_flight"] = UNKNOWN_WHY["in_flight"]
    if not capabilities.oldest_age:
        unknown["oldest_age"] = UNKNOWN_WHY["oldest_age"]
    return unknown
