"""The outcome counting rules against the vectors the Rust suite reads too
(schemas/vectors/outcomes.json): ``outcome_messages`` (what
``report_hint_outcomes`` publishes) gives, from a step's rows, the
``HintOutcome`` messages stage 2's ``hint_outcomes`` gives, field for field,
with no field the case leaves out."""

from typing import Any, Dict

import pytest

from hintstream import group_key
from hintstream.outcomes import DeliveredHints, outcome_messages
from vectors import shared_vectors

VECTORS = shared_vectors("outcomes.json")


@pytest.mark.parametrize("case", VECTORS["cases"], ids=lambda c: c["case"])
def test_outcomes_are_the_shared_vectors(case: Dict[str, Any]) -> None:
    # The client delivered each hint for the group of its first hinted row.
    delivered = DeliveredHints(1000)
    for row in case["rows"]:
        if row["is_hinted"] and "hint_id" in row and delivered.group_of(row["hint_id"]) is None:
            delivered.add({"hint_id": row["hint_id"], "run_id": row["run_id"], "step": row["step"], "instance_id": row["instance_id"]})
    got = outcome_messages(delivered, case["rows"], case["success_threshold"])
    for key, message in got:
        assert key == group_key(message["run_id"], message["step"], message["instance_id"])
        assert message.pop("created_at").endswith("Z")
    assert [message for _, message in got] == case["outcomes"]
