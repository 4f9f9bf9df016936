"""ackwise-sqs: the Amazon SQS adapter for ackwise (``sqs://``).

Importing this package stays light (the entry point imports :mod:`ackwise_sqs.plugin`
through it): the adapter and boto3 are imported on first use of these names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ackwise_sqs._adapter import (
        MAX_DELAY,
        MAX_MESSAGE_SIZE,
        MAX_VISIBILITY,
        SQSAdapter,
        SQSReceipt,
        sqs_queue_name,
    )
    from ackwise_sqs._errors import (
        VisibilityCapReached,
        map_botocore_errors,
        translate_botocore_error,
    )
    from ackwise_sqs._url import MAX_DELAY_SECONDS, SQSSettings, parse_sqs_url

__all__ = [
    "MAX_DELAY",
    "MAX_DELAY_SECONDS",
    "MAX_MESSAGE_SIZE",
    "MAX_VISIBILITY",
    "SQSAdapter",
    "SQSReceipt",
    "SQSSettings",
    "VisibilityCapReached",
    "map_botocore_errors",
    "parse_sqs_url",
    "sqs_queue_name",
    "translate_botocore_error",
]

#: Where each public name lives: imported from there on first use.
_WHERE = {
    name: module
    for module, names in {
        "_adapter": (
            "MAX_DELAY",
            "MAX_MESSAGE_SIZE",
            "MAX_VISIBILITY",
            "SQSAdapter",
            "SQSReceipt",
            "sqs_queue_name",
        ),
        "_errors": ("VisibilityCapReached", "map_botocore_errors", "translate_botocore_error"),
        "_url": ("MAX_DELAY_SECONDS", "SQSSettings", "parse_sqs_url"),
    }.items()
    for name in names
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'ackwise_sqs' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"ackwise_sqs.{module}"), name)
