"""Files ackwise did not write, dropped into a queue's directories, never cost a valid message.

Each record is ``(where, raw bytes)``: a file under a name ackwise would give it in ``ready/``,
under a foreign name in ``ready/``, or as an expired lease in ``leased/`` (with an ackwise
name or a foreign one).  The worker must dead-letter every one and run every valid task once.
"""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ackwise_conformance.corruption import drain_among_corrupt

_seqs = itertools.count(10**15)  # far above what the queue's own counter hands out
_PLACES = ("ready", "ready-foreign", "leased", "leased-foreign")
_raw = st.one_of(
    st.binary(max_size=64),
    st.just(b""),
    st.just(b'{"id": 1}\nbody'),  # a header, but no string id
    st.just(b'{"id": "m-1", "enqueued_at": 0}\nnot an envelope'),  # framed: decode_error
)


@pytest.fixture(scope="session")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("dirq-corrupt") / "queues"


def write(root: Path, queue: str, record: tuple[str, bytes]) -> bytes | None:
    """Drop ``record`` into ``queue`` as a foreign writer would; the bytes its dead letter
    keeps (the whole file, when the adapter cannot read it as a message)."""
    place, raw = record
    seq = next(_seqs)
    name = {
        "ready": f"{0:016d}-{seq:020d}-0",
        "ready-foreign": f"dropped-{seq}.json",
        "leased": f"{seq:020d}-1-{seq:x}",
        "leased-foreign": f"stuck-{seq}",
    }[place]
    path = root / queue / place.split("-")[0] / name
    path.write_bytes(raw)
    if place.startswith("leased"):
        os.utime(path, (1.0, 1.0))  # a lease that expired long ago
    head, newline, _ = raw.partition(b"\n")
    try:
        framed = bool(newline) and isinstance(json.loads(head).get("id"), str)
    except (ValueError, AttributeError):
        framed = False
    return None if framed else raw


@given(st.lists(st.tuples(st.sampled_from(_PLACES), _raw), min_size=1, max_size=4))
@settings(max_examples=10, deadline=None)
def test_foreign_files_are_dead_lettered_and_valid_messages_run_once(
    root: Path, records: list[tuple[str, bytes]]
) -> None:
    drain_among_corrupt(f"dirq://{root}", records, lambda q, r: write(root, q, r))
