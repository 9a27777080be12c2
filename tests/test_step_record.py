"""StepRecord: the steps.jsonl row of the step in progress keeps its field order and its counters."""

import json
from types import SimpleNamespace

import pytest
import torch

from trainer import steps_log
from trainer.step_record import StepRecord


def test_row_has_the_fields_in_order_with_counters_intact():
    rec = StepRecord()
    rec.seconds["generate"] += 1.5
    rec.grader.update({"timeouts": 2})
    rec.update(gate_stat=0.25, task_ids_trained=["p1"])
    row = rec.to_row()
    assert list(row)[:4] == ["seconds", "grader", "groups", "gate_stat"] and list(row)[-5:] == [
        "sampler",
        "nonfinite_losses",
        "update_skipped",
        "sampler_agreement",
        "gpu_memory",
    ]
    assert row["seconds"]["generate"] == 1.5 and row["grader"] == {"timeouts": 2}
    assert json.loads(json.dumps(row))["task_ids_trained"] == ["p1"]
    with pytest.raises(AttributeError, match="no field 'gate_stats'"):
        rec.update(gate_stats=0.5)


class FakeCuda:
    """torch.cuda's memory calls as a GPU answers them: a peak that resets, the device's free/total."""

    def __init__(self, used_gib: float):
        self.peak, self.resets, self.used = 50 * 2**30, 0, used_gib * 2**30

    def install(self, monkeypatch):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", self.reset)
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: self.peak)
        monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda: self.peak + 2**30)
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (140 * 2**30 - self.used, 140 * 2**30))

    def reset(self):
        self.resets += 1


def step_of(log, args, record):
    trainer = SimpleNamespace(step_record=record, record_train_seconds=lambda: None)
    log.trainer = trainer
    log.on_step_begin(args, None, None)
    log.on_step_end(args, None, None)
    return record.to_row()["gpu_memory"]


@pytest.mark.parametrize("sleep", [True, False])
def test_a_gpu_step_records_its_peak_and_what_the_device_holds_after_the_pass(monkeypatch, sleep):
    cuda = FakeCuda(used_gib=60.0 if sleep else 110.0)  # a slept engine gives its share back
    cuda.install(monkeypatch)
    args = SimpleNamespace(use_cpu=False, use_vllm=True, vllm_mode="colocate", vllm_enable_sleep_mode=sleep)
    log = object.__new__(steps_log.StepsLog)
    row = step_of(log, args, StepRecord())
    assert cuda.resets == 1  # the peak is the step's own
    assert row == {
        "peak_allocated_gib": 50.0,
        "peak_reserved_gib": 51.0,
        "device_used_gib": 60.0 if sleep else 110.0,
        "total_gib": 140.0,
        "vllm_sleep_mode": sleep,
    }
    args.vllm_mode = "server"  # a server's engine sleeps on its own GPUs, not beside this pass
    assert step_of(log, args, StepRecord())["vllm_sleep_mode"] is False


def test_a_cpu_step_records_no_gpu_memory(monkeypatch):
    cuda = FakeCuda(used_gib=1.0)
    cuda.install(monkeypatch)
    args = SimpleNamespace(use_cpu=True, use_vllm=False, vllm_mode="colocate", vllm_enable_sleep_mode=False)
    assert step_of(object.__new__(steps_log.StepsLog), args, StepRecord()) is None and cuda.resets == 0
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    args.use_cpu = False
    assert step_of(object.__new__(steps_log.StepsLog), args, StepRecord()) is None
