"""Kafka keys of the wire contract.

A group's messages (failed trajectories, hints) are keyed
``run_id/step/instance_id``; a step's messages (scored rollouts, advantages,
metrics) ``run_id/step``. Inside ``run_id`` and ``instance_id`` the two
characters that could make different ids share a key are percent-encoded:
``%`` as ``%25`` and ``/`` as ``%2F`` (nothing else), so ids without them
keep their plain keys.
"""

from __future__ import annotations

import re
from typing import Tuple

_DECODE = re.compile(r"%(25|2[Ff])")
_DIGITS = re.compile(r"[0-9]+")


def encode_id(value: str) -> str:
    """Percent-encodes ``%`` and ``/`` (only those) of an id used in a key."""
    return value.replace("%", "%25").replace("/", "%2F")


def decode_id(value: str) -> str:
    """Inverse of :func:`encode_id` (``%2f`` accepted too); other ``%``
    sequences are left as they are."""
    return _DECODE.sub(lambda m: "%" if m.group(1) == "25" else "/", value)


def group_key(run_id: str, step: int, instance_id: str) -> str:
    """``run_id/step/instance_id``, ids encoded: the key of a GRPO group's
    failed trajectories and of its hint."""
    return f"{encode_id(run_id)}/{int(step)}/{encode_id(instance_id)}"


def step_key(run_id: str, step: int) -> str:
    """``run_id/step``, run_id encoded: the key of a training step's scored
    rollouts, advantages and metrics."""
    return f"{encode_id(run_id)}/{int(step)}"


def parse_step_key(key: str) -> Tuple[str, int]:
    """``(run_id, step)`` of a step key; ``ValueError`` when it is not one."""
    encoded_run, sep, step = key.rpartition("/")
    if not sep or not encoded_run or "/" in encoded_run or not _DIGITS.fullmatch(step):
        raise ValueError(f"not a run_id/step key: {key!r}")
    return decode_id(encoded_run), int(step)


def parse_group_key(key: str) -> Tuple[str, int, str]:
    """``(run_id, step, instance_id)`` of a group key; ``ValueError`` when it
    is not one."""
    parts = key.split("/")
    if len(parts) != 3 or not parts[0] or not _DIGITS.fullmatch(parts[1]) or not parts[2]:
        raise ValueError(f"not a run_id/step/instance_id key: {key!r}")
    return decode_id(parts[0]), int(parts[1]), decode_id(parts[2])
