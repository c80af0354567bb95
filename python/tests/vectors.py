"""The vector files both test suites read (``schemas/vectors/*.json``):
what the Rust crate and this package both implement, held to one set of
cases (the Rust side's reader: ``src/messages/vectors.rs``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

VECTORS_DIR = Path(__file__).resolve().parents[2] / "schemas" / "vectors"


def shared_vectors(name: str) -> Any:
    """``schemas/vectors/{name}``, parsed."""
    return json.loads((VECTORS_DIR / name).read_text("utf-8"))
