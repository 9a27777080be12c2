"""GRPO from the shipped embedded base moves the model the way S2's cap policy should (issue 13).

Under S2 a format-rejected rollout ("The answer is 7." with no \\boxed{}) in a qualifying group gets reward 0
and stays in the loss, so its ending is pushed down while correct, boxed endings are pushed up. A few steps
must therefore raise log p(boxed ending) - log p(unboxed ending) on problems never trained on. A base that
answers nothing (no group qualifies) or a trainer that drops the gradient leaves the margin where it was.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, Qwen3_5ForConditionalGeneration

from data.prompt import render_prompt
from embedded.build import embedded_eval_sets, embedded_tasks

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent

RUN = {  # the S2 recipe, shortened: 3 steps of 4 groups, no evaluation
    "max_steps": 3,
    "groups_per_step": 4,
    "problems_per_round": 8,
    "learning_rate": 2e-4,
    "eval_every": 0,
    "checkpoint_steps": "3",
    "report_to": "none",
    "grader_workers": 1,
    "disable_tqdm": "true",
}


def ending_margin(model, tokenizer, tasks) -> float:
    """Mean over tasks of log p(boxed final line) - log p(bare final line), after the reference steps."""
    margins = []
    for t in tasks:
        *body, _ = t["solution"].split("\n")
        prefix = render_prompt(tokenizer, t["problem"]) + "\n".join(body) + "\n"
        p_ids = tokenizer(prefix, add_special_tokens=False)["input_ids"]
        endings = [f"The answer is $\\boxed{{{t['answer']}}}$.", f"The answer is {t['answer']}."]
        scores = []
        for ending in endings:
            e_ids = tokenizer(ending, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
            ids = torch.tensor([p_ids + e_ids])
            with torch.no_grad():
                logps = model(input_ids=ids).logits[0, :-1].log_softmax(-1)
            targets = ids[0, 1:]
            scores.append(logps[len(p_ids) - 1 :].gather(1, targets[len(p_ids) - 1 :, None]).sum().item())
        margins.append(scores[0] - scores[1])
    return sum(margins) / len(margins)


def test_s2_steps_push_unboxed_endings_down(tiny_base, embedded_snapshot, tmp_path):
    out = tmp_path / "S2"
    cmd = [
        sys.executable,
        "-m",
        "trainer.train",
        "--config",
        str(REPO / "configs/embedded.yaml"),
        "--arm",
        "S2",
    ]
    cmd += ["--model_name_or_path", str(tiny_base), "--snapshot_path", str(embedded_snapshot)]
    cmd += ["--output_dir", str(out)]
    for k, v in RUN.items():
        cmd += [f"--{k}", *str(v).split()]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    steps = [json.loads(line) for line in (out / "results" / "steps.jsonl").read_text().splitlines()]
    trained = sum(r["outcomes_trained"]["format_rejected"] for r in steps)
    assert trained > 0, "no format-rejected rollout was trained on: the test would prove nothing"

    tasks = embedded_tasks()
    by_id = {t["id"]: t for t in tasks}
    heldout = [by_id[i] for i in embedded_eval_sets(tasks).heldout[:24]]
    tokenizer = AutoTokenizer.from_pretrained(tiny_base)
    torch.manual_seed(0)
    base = Qwen3_5ForConditionalGeneration.from_pretrained(tiny_base, dtype=torch.float32).eval()
    after = Qwen3_5ForConditionalGeneration.from_pretrained(out / "step003", dtype=torch.float32).eval()
    before_margin, after_margin = (
        ending_margin(base, tokenizer, heldout),
        ending_margin(after, tokenizer, heldout),
    )
    print(f"boxed-vs-bare ending margin: base {before_margin:.3f} -> step 3 {after_margin:.3f} nats")
    assert after_margin > before_margin + 0.05, (before_margin, after_margin)
