"""Header names, content types, hint categories and default topic names
against the vectors the Rust suite reads too (schemas/vectors/wire_names.json):
the package writes and reads the names the stages do, and defines no header
name the vectors do not list."""

import ast
import dataclasses
import importlib
import pkgutil
from pathlib import Path

import hintstream
from hintstream import wire
from vectors import shared_vectors

VECTORS = shared_vectors("wire_names.json")


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


# What the TRL modules import, installed only in the rl venv
# (scripts/rl-venv.sh): a module that needs one is read, not imported.
OPTIONAL = {"torch", "transformers", "trl", "gguf", "datasets", "accelerate"}


def _header_constants(module_name: str) -> dict:
    """The module's upper-case `*_HEADER` string constants."""
    try:
        mod = importlib.import_module(f"hintstream.{module_name}")
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] not in OPTIONAL:
            raise
        source = Path(hintstream.__path__[0], f"{module_name}.py").read_text()
        values = {}
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
                for target in node.targets:
                    if isinstance(target, ast.Name) and isinstance(node.value.value, str):
                        values[target.id] = node.value.value
    else:
        values = vars(mod)
    return {
        name: value
        for name, value in values.items()
        if name.isupper() and name.endswith("_HEADER") and isinstance(value, str)
    }


def test_the_package_defines_no_header_name_off_the_vectors() -> None:
    known = set(VECTORS["headers"].values())
    found = {}
    for module in pkgutil.iter_modules(hintstream.__path__):
        for name, value in _header_constants(module.name).items():
            found[f"{module.name}.{name}"] = value
    assert "wire.CHUNK_HEADER" in found, found
    assert {where: value for where, value in found.items() if value not in known} == {}


def test_hint_categories_are_the_shared_vectors() -> None:
    assert list(wire.CATEGORIES) == VECTORS["categories"]
    assert [wire.CATEGORY_LLM, wire.CATEGORY_STATIC, wire.CATEGORY_LLM_FAILED] == VECTORS["categories"]


def test_default_topics_are_the_shared_vectors() -> None:
    ours = dataclasses.asdict(wire.Topics())
    assert ours == {name: VECTORS["topics"][name] for name in ours}
