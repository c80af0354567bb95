"""Reads an offline W&B run back: the ``run-*.wandb`` transaction log
(W&B's LevelDB-style log: a 7-byte header ``:W&B`` + 0xBEE1 + version, then
32 KiB blocks of records with a 7-byte header: CRC32, length, type) holds one
protobuf ``Record`` per entry; history rows are ``record.history.item``."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any, Dict, Iterator, List

BLOCK = 32 * 1024
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> Iterator[bytes]:
    data = path.read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path} is not a W&B transaction log")
    pos, pending = HEADER, b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # block trailer padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        pos += HEADER
        body = data[pos : pos + length]
        pos += length
        if kind == FULL:
            yield body
        elif kind == FIRST:
            pending = body
        elif kind == MIDDLE:
            pending += body
        elif kind == LAST:
            yield pending + body
        elif kind == 0 and length == 0:
            pos += BLOCK - pos % BLOCK if pos % BLOCK else 0


def read_run(path: Path) -> Dict[str, List[Any]]:
    """``{"history": [row dict, ...], "metrics": [(name, step_metric), ...]}``."""
    from wandb.proto import wandb_internal_pb2 as pb

    out: Dict[str, List[Any]] = {"history": [], "metrics": []}
    for raw in records(path):
        record = pb.Record()
        record.ParseFromString(raw)
        kind = record.WhichOneof("record_type")
        if kind == "history":
            out["history"].append({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in record.history.item})
        elif kind == "metric":
            m = record.metric
            out["metrics"].append((m.name or m.glob_name, m.step_metric))
    return out
