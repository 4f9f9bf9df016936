"""Fixtures of the SQS adapter's tests: one moto server per session, over real HTTP.

The server is started by the conformance suite (as ``ackwise_sqs._provision`` says) on a free
port (``moto[server]`` is a test dependency only); ``ACKWISE_TEST_SQS_URL`` points the tests at
another SQS instead (real AWS, ElasticMQ, LocalStack).  Without moto the tests skip, or fail
under ``CI=true``.  moto accepts any credentials: the tests set dummy ones in the environment
(inherited by the worker processes of level 2) unless some are set already.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from ackwise_conformance.brokers import (
    BrokerHandle,
    provide_or_skip,
)

for _name, _value in (
    ("AWS_ACCESS_KEY_ID", "testing"),
    ("AWS_SECRET_ACCESS_KEY", "testing"),
    ("AWS_DEFAULT_REGION", "us-east-1"),
):
    os.environ.setdefault(_name, _value)


@pytest.fixture(scope="session")
def sqs_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerHandle]:
    handle = provide_or_skip("sqs", tmp_dir=tmp_path_factory.mktemp("sqs"))
    yield handle
    handle.stop()


@pytest.fixture
def sqs_url(sqs_broker: BrokerHandle) -> str:
    """The broker's URL with a queue-name prefix of this test's own."""
    sep = "&" if "?" in sqs_broker.url else "?"
    return f"{sqs_broker.url}{sep}prefix=t{uuid.uuid4().hex[:10]}-"


@pytest.fixture
def on_moto(sqs_broker: BrokerHandle) -> bool:
    """Whether the tests run against the moto server they started (not a real SQS)."""
    return sqs_broker.source in ("local", "container")
