"""Corrupt storage in JetStream never costs a valid message nor stops a worker.

Records are published straight onto a queue's subjects with a raw nats-py client, among
valid messages, the way a foreign publisher would: without ackwise's headers, with a delivery
count that is no number, on the delayed subject with an unreadable due time.  A real worker
drains the queue (``ackwise_conformance.corruption``).
"""

from __future__ import annotations

import asyncio

import nats
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ackwise_conformance.brokers import BrokerHandle
from ackwise_conformance.corruption import drain_among_corrupt
from ackwise_nats._names import QueueNames

PREFIX = "corrupt"

#: (subject kind, headers, body): what a foreign publisher could leave on a queue's subjects.
Record = tuple[str, dict[str, str], bytes]

_records = st.tuples(
    st.sampled_from(["ready", "delayed"]),
    st.sampled_from(
        [
            {},
            {"Ackwise-Attempts": "many"},
            {"Ackwise-Not-Before": "tomorrow"},
            {"Foreign": "yes", "Ackwise-Attempts": "-1"},
        ]
    ),
    st.binary(max_size=64),
)


def _writer(url: str):  # type: ignore[no-untyped-def]
    def write(queue: str, record: Record) -> bytes:
        kind, headers, body = record
        names = QueueNames.of(PREFIX, queue)
        subject = names.ready if kind == "ready" else names.delayed

        async def publish() -> None:
            nc = await nats.connect(url)
            try:
                await nc.jetstream().publish(subject, body, headers=headers or None)
            finally:
                await nc.close()

        asyncio.run(publish())
        return body

    return write


@given(st.lists(_records, min_size=1, max_size=3))
@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_foreign_messages_never_cost_a_valid_one(
    nats_broker: BrokerHandle, records: list[Record]
) -> None:
    url = f"{nats_broker.url}?prefix={PREFIX}"
    drain_among_corrupt(url, records, write=_writer(nats_broker.url))
