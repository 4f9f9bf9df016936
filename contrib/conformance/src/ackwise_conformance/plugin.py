"""ackwise plugin of ackwise-conformance: adds the ``ackwise conformance`` command."""

from __future__ import annotations

import argparse
from typing import Any

from ackwise import hookimpl


@hookimpl
def ackwise_add_commands(subparsers: argparse._SubParsersAction[Any]) -> None:
    from ackwise_conformance.cli import add_parser

    add_parser(subparsers)
