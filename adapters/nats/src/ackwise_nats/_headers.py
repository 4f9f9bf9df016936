"""The headers ackwise's messages carry on JetStream."""

from __future__ import annotations

__all__ = ["H_ATTEMPT", "H_ATTEMPTS", "H_DEAD_AT", "H_ID", "H_NOT_BEFORE", "H_REASON"]

#: The message id (JetStream's own Nats-Msg-Id deduplicates: ackwise's ids are not unique).
H_ID = "Ackwise-Id"
#: Epoch seconds before which a message on the delayed subject is not delivered.
H_NOT_BEFORE = "Ackwise-Not-Before"
#: Deliveries a message had before this copy of it (a nack with delay publishes a copy).
H_ATTEMPTS = "Ackwise-Attempts"
#: A dead letter's reason, when it died and the attempt it died at.
H_REASON = "Ackwise-Reason"
H_ATTEMPT = "Ackwise-Attempt"
H_DEAD_AT = "Ackwise-Dead-At"
