"""Chunked steps against the vectors the Rust suite reads too
(schemas/vectors/chunks.json): ``wire.chunk_info`` reads chunk headers as
``ChunkInfo::from_headers`` does, and ``reassemble.Reassembler`` (what
``TrainerClient.wait_advantages`` uses) gathers chunks into the steps
``tools::reassemble`` makes of them."""

from typing import Any, Dict, List, Optional, Tuple

import pyarrow as pa
import pytest

from hintstream.reassembly import Partial, Reassembler
from hintstream.wire import ChunkInfo, chunk_info, ipc_stream
from vectors import shared_vectors

VECTORS = shared_vectors("chunks.json")


def headers(case: Dict[str, Any]) -> List[Tuple[str, Optional[bytes]]]:
    return [(name, None if value is None else value.encode("utf-8")) for name, value in case["headers"]]


@pytest.mark.parametrize("case", VECTORS["chunk_info"], ids=lambda c: c["case"])
def test_chunk_headers_read_as_the_shared_vectors(case: Dict[str, Any]) -> None:
    if "error" in case:
        with pytest.raises(ValueError) as raised:
            chunk_info(headers(case))
        assert case["error"] in str(raised.value)
    else:
        assert chunk_info(headers(case)) == ChunkInfo(case["index"], case["count"], case["rows"])


def payload(message: Dict[str, Any]) -> bytes:
    if "raw" in message:
        return message["raw"].encode("utf-8")
    return ipc_stream(pa.table({"id": pa.array(message["ids"], pa.int64())}))


@pytest.mark.parametrize("case", VECTORS["reassembly"], ids=lambda c: c["case"])
def test_chunks_reassemble_as_the_shared_vectors(case: Dict[str, Any]) -> None:
    reader = Reassembler()
    for i, message in enumerate(case["messages"]):
        expect = message["expect"]
        push = lambda: reader.push(message["key"].encode("utf-8"), headers(message), payload(message))  # noqa: E731
        if expect is not None and "error" in expect:
            with pytest.raises(ValueError) as raised:
                push()
            assert expect["error"] in str(raised.value), f"message {i}"
            continue
        step = push()
        if expect is None:
            assert step is None, f"message {i} completed {step}"
        else:
            want = expect["step"]
            assert step is not None, f"message {i} completed nothing"
            assert (step.key, step.table.column("id").to_pylist(), step.chunks) == (want["key"], want["ids"], want["chunks"]), f"message {i}"
    assert reader.partial() == [Partial(p["key"], p["arrived"], p["count"]) for p in case["partial"]]


def test_chunks_of_two_schemas_are_not_one_step() -> None:
    # Not a shared vector: tools::reassemble returns such a step as batches
    # of two schemas, where a table cannot hold them.
    reader = Reassembler()
    chunk = [("hintstream.chunk", b"0"), ("hintstream.chunks", b"2")]
    assert reader.push(b"r/1", chunk, ipc_stream(pa.table({"id": pa.array([0], pa.int64())}))) is None
    chunk[0] = ("hintstream.chunk", b"1")
    with pytest.raises(ValueError, match="do not share one schema"):
        reader.push(b"r/1", chunk, ipc_stream(pa.table({"other": pa.array(["x"])})))
