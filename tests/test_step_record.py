"""StepRecord: the steps.jsonl row of the step in progress keeps its field order and its counters."""

import json

import pytest

from trainer.step_record import StepRecord


def test_row_has_the_fields_in_order_with_counters_intact():
    rec = StepRecord()
    rec.seconds["generate"] += 1.5
    rec.grader.update({"timeouts": 2})
    rec.update(gate_stat=0.25, task_ids_trained=["p1"])
    row = rec.to_row()
    assert list(row)[:4] == ["seconds", "grader", "groups", "gate_stat"] and list(row)[-3:] == [
        "sampler",
        "nonfinite_losses",
        "update_skipped",
    ]
    assert row["seconds"]["generate"] == 1.5 and row["grader"] == {"timeouts": 2}
    assert json.loads(json.dumps(row))["task_ids_trained"] == ["p1"]
    with pytest.raises(AttributeError, match="no field 'gate_stats'"):
        rec.update(gate_stats=0.5)
