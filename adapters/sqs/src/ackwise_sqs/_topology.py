"""The SQS queues behind an ackwise queue: their names, their creation with the dead-letter queue
and its redrive policy, and what the adapter knows of each (URLs, size limit, max deliveries).

See the adapter's overview (:mod:`ackwise_sqs._adapter`): *dead letters*.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import ClientError

from ackwise.errors import PermanentAdapterError, PublishError, QueueNotFound
from ackwise.spi import QueueSpec
from ackwise_sqs._client import Client
from ackwise_sqs._errors import error_code
from ackwise_sqs._url import SQSSettings

__all__ = ["Topology", "sqs_queue_name"]

_RETENTION = 1_209_600  # 14 days, SQS's longest
# ackwise queue names, as SQS takes them: the prefix and the "-dlq" suffix must fit in 80.
_NAME = re.compile(r"^[A-Za-z0-9_-]+(\.fifo)?$")
_NAME_ROOM = 80 - len("-dlq")


def sqs_queue_name(prefix: str, queue: str) -> tuple[str, str]:
    """Return (queue, dead-letter queue) SQS names for ackwise queue ``queue``.

    :raises PublishError: the name cannot be an SQS queue name (the message says why).
    """
    name = prefix + queue
    if not _NAME.match(queue) or len(name) > _NAME_ROOM:
        raise PublishError(
            f"invalid queue name {queue!r} for SQS: letters, digits, '-' and '_', optionally "
            f"ending in '.fifo', at most {_NAME_ROOM - len(prefix)} characters with the prefix "
            f"{prefix!r} (SQS allows 80, and ackwise adds '-dlq' for the dead-letter queue)"
        )
    if name.endswith(".fifo"):
        return name, name.removesuffix(".fifo") + "-dlq.fifo"
    return name, name + "-dlq"


@dataclass
class _Queue:
    name: str
    url: str
    dlq_url: str
    fifo: bool
    max_size: int
    max_deliveries: int | None = None
    group: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class Topology:
    """Names, creation and description of a queue and its dead-letter queue, and what the
    adapter knows of each (:meth:`queue`)."""

    def __init__(self, settings: SQSSettings, client: Client) -> None:
        self.settings = settings
        self._client = client
        self._queues: dict[str, _Queue] = {}

    # -- topology --------------------------------------------------------------------------
    def declare(self, queue: QueueSpec) -> None:
        name, dlq_name = sqs_queue_name(self.settings.prefix, queue.name)
        fifo = name.endswith(".fifo")
        base: dict[str, str] = {"MessageRetentionPeriod": str(_RETENTION)}
        if fifo:
            base["FifoQueue"] = "true"
        dlq_url = self._create(dlq_name, base)
        dlq_arn = self._client.call(
            "GetQueueAttributes", QueueUrl=dlq_url, AttributeNames=["QueueArn"]
        )["Attributes"]["QueueArn"]
        url = self._create(name, base)
        redrive = json.dumps(
            {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": str(queue.max_deliveries + 1)}
        )
        self._client.call(
            "SetQueueAttributes",
            QueueUrl=url,
            Attributes={"RedrivePolicy": redrive, "MessageRetentionPeriod": str(_RETENTION)},
        )
        info = self._describe(queue.name, url, dlq_url, fifo)
        info.max_deliveries = queue.max_deliveries
        group = queue.options.get("message_group_id")
        info.group = str(group) if group else None

    def _create(self, name: str, attributes: dict[str, str]) -> str:
        try:
            return str(
                self._client.call("CreateQueue", QueueName=name, Attributes=attributes)["QueueUrl"]
            )
        except PermanentAdapterError as exc:
            # QueueAlreadyExists: same name, other attributes; the attributes are set after.
            cause = exc.__cause__
            if isinstance(cause, ClientError) and error_code(cause).endswith("QueueAlreadyExists"):
                return str(self._client.call("GetQueueUrl", QueueName=name)["QueueUrl"])
            raise

    def _describe(self, queue: str, url: str, dlq_url: str, fifo: bool) -> _Queue:
        attrs = self._client.call("GetQueueAttributes", QueueUrl=url, AttributeNames=["All"])[
            "Attributes"
        ]
        info = _Queue(
            name=queue,
            url=url,
            dlq_url=dlq_url,
            fifo=fifo,
            max_size=int(attrs.get("MaximumMessageSize", 262_144)),
        )
        redrive = attrs.get("RedrivePolicy")
        if redrive:
            info.max_deliveries = int(json.loads(redrive)["maxReceiveCount"]) - 1
        self._queues[queue] = info
        return info

    def queue(self, queue: str) -> _Queue:
        """The queue's URLs and limits; declared with defaults when it does not exist yet."""
        info = self._queues.get(queue)
        if info is not None:
            return info
        name, dlq_name = sqs_queue_name(self.settings.prefix, queue)
        try:
            url = str(self._client.call("GetQueueUrl", QueueName=name)["QueueUrl"])
            dlq_url = str(self._client.call("GetQueueUrl", QueueName=dlq_name)["QueueUrl"])
        except QueueNotFound:
            self.declare(QueueSpec(queue))
            return self._queues[queue]
        return self._describe(queue, url, dlq_url, name.endswith(".fifo"))

    def delete_queue(self, queue: str) -> None:
        """Delete the queue and its dead-letter queue (SQS: a name is free again after 60 s)."""
        self._queues.pop(queue, None)
        for name in sqs_queue_name(self.settings.prefix, queue):
            try:
                url = str(self._client.call("GetQueueUrl", QueueName=name)["QueueUrl"])
                self._client.call("DeleteQueue", QueueUrl=url)
            except QueueNotFound:
                continue

    def queues(self) -> Sequence[str]:
        prefix = self.settings.prefix
        names: list[str] = []
        params: dict[str, Any] = {"MaxResults": 1000}
        if prefix:
            params["QueueNamePrefix"] = prefix
        while True:
            out = self._client.call("ListQueues", **params)
            for url in out.get("QueueUrls", []):
                name = url.rsplit("/", 1)[-1]
                if not name.startswith(prefix) or name.endswith(("-dlq", "-dlq.fifo")):
                    continue
                names.append(name[len(prefix) :])
            token = out.get("NextToken")
            if not token:
                return sorted(names)
            params["NextToken"] = token
