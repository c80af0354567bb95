"""Shared fixtures: one broker for the session (an Apache Kafka node started here, or
HINTSTREAM_TEST_BOOTSTRAP), the loopback LLM server, and fresh topics with
both stages running as processes for each test that asks for a pipeline."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Callable, Iterator, List

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from harness import Kafka, LlmServer, Pipeline, wait_for_broker  # noqa: E402

from hintstream import TrainerClient  # noqa: E402


class Broker:
    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap


@pytest.fixture(scope="session")
def broker() -> Iterator[Broker]:
    if os.environ.get("HINTSTREAM_TEST_BOOTSTRAP"):
        bootstrap = os.environ["HINTSTREAM_TEST_BOOTSTRAP"]
        wait_for_broker(bootstrap)
        yield Broker(bootstrap)
        return
    kafka = Kafka().start()
    try:
        yield Broker(kafka.bootstrap)
    finally:
        kafka.kill()


@pytest.fixture(scope="session")
def llm() -> Iterator[LlmServer]:
    server = LlmServer()
    yield server
    server.stop()


@pytest.fixture
def make_pipeline(broker: Broker, llm: LlmServer, tmp_path: Path) -> Iterator[Callable[..., Pipeline]]:
    made: List[Pipeline] = []

    def make(**kwargs: object) -> Pipeline:
        p = Pipeline(broker.bootstrap, llm, tmp_path, **kwargs)  # type: ignore[arg-type]
        made.append(p)
        return p

    yield make
    for p in made:
        p.stop()


@pytest.fixture
def make_client() -> Iterator[Callable[..., TrainerClient]]:
    made: List[TrainerClient] = []

    def make(bootstrap: str, topics: object, **kwargs: object) -> TrainerClient:
        c = TrainerClient(bootstrap, topics=topics, **kwargs)  # type: ignore[arg-type]
        made.append(c)
        return c

    yield make
    for c in made:
        c.close(timeout=5)
