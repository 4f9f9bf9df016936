"""How a case ends other than passing: not applicable, pending, failed."""

from __future__ import annotations

__all__ = ["NotApplicable", "Pending", "ScenarioFailed"]


class NotApplicable(Exception):
    """The scenario cannot be expressed on this adapter (the reason names the capability)."""


class Pending(Exception):
    """The scenario needs a part of ackwise that is not built yet."""


class ScenarioFailed(AssertionError):
    """The adapter broke the contract; the message says which message, expected, happened."""
