"""SQS's limits as the adapter holds them: visibility, delay, message size, batch size.

See the adapter's overview (:mod:`ackwise_sqs._adapter`).
"""

from __future__ import annotations

#: SQS's cap on a message's visibility timeout, per receive (12 hours).
MAX_VISIBILITY = 43200
#: The longest delay (publish or nack) the adapter holds: SQS's visibility cap.
MAX_DELAY = float(MAX_VISIBILITY)
#: SQS's largest message (1 MiB, body and attributes), less room for ackwise's attributes.
MAX_MESSAGE_SIZE = 1_048_576 - 1024
_BATCH = 10  # SQS's limit on entries per batch call
