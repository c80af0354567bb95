"""Header names, content types, hint categories and default topic names
against the vectors the Rust suite reads too (schemas/vectors/wire_names.json):
the package writes and reads the names the stages do, and defines no header
name the vectors do not list."""

import dataclasses
import importlib
import json
import pkgutil
from pathlib import Path

import hintstream
from hintstream import wire

VECTORS = json.loads((Path(__file__).resolve().parents[2] / "schemas" / "vectors" / "wire_names.json").read_text("utf-8"))


def test_header_names_and_content_types_are_the_shared_vectors() -> None:
    ours = {
        "chunk": wire.CHUNK_HEADER,
        "chunks": wire.CHUNKS_HEADER,
        "rows": wire.ROWS_HEADER,
        "attempt": wire.ATTEMPT_HEADER,
        "content_type": wire.CONTENT_TYPE_HEADER,
    }
    assert ours == {name: VECTORS["headers"][name] for name in ours}
    assert wire.ARROW_STREAM_CONTENT_TYPE == VECTORS["content_types"]["arrow_stream"]


def test_the_package_defines_no_header_name_off_the_vectors() -> None:
    known = set(VECTORS["headers"].values())
    found = {}
    for module in pkgutil.iter_modules(hintstream.__path__):
        mod = importlib.import_module(f"hintstream.{module.name}")
        for name, value in vars(mod).items():
            if name.isupper() and name.endswith("_HEADER") and isinstance(value, str):
                found[f"{module.name}.{name}"] = value
    assert "wire.CHUNK_HEADER" in found, found
    assert {where: value for where, value in found.items() if value not in known} == {}


def test_hint_categories_are_the_shared_vectors() -> None:
    assert list(wire.CATEGORIES) == VECTORS["categories"]
    assert [wire.CATEGORY_LLM, wire.CATEGORY_STATIC, wire.CATEGORY_LLM_FAILED] == VECTORS["categories"]


def test_default_topics_are_the_shared_vectors() -> None:
    ours = dataclasses.asdict(wire.Topics())
    assert ours == {name: VECTORS["topics"][name] for name in ours}
