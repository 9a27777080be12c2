"""FSDP2 on two CPU processes (gloo), launched by tests/test_fsdp2.py through torch.distributed.run.

accelerate runs CPU processes as plain DDP whatever its config says, so this probe shards the tiny Qwen3.5
with `fully_shard` itself and drives the code that only runs under FSDP2 on a GPU machine: stateNNN/ export
and import (trainer/checkpoint.py through engine/sharding.py) and the evaluation of a sharded model
(EvalCallback). Writes its findings as JSON for the test to assert on.
"""

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist
from accelerate import PartialState
from scripted import TextGrader, tiny_random_model
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from engine import sharding
from rundir.files import read_jsonl
from rundir.state import load_state, save_state
from trainer.checkpoint import export_optimizer, import_optimizer, load_masters_into_model
from trainer.eval_callback import EvalCallback, checkpoint_weights
from trainer.evaluation import EvalSpec, run_eval


def sharded_model(mesh):
    tok, model = tiny_random_model()
    for name, p in model.named_parameters():
        p.requires_grad_("visual" not in name)  # as load_base_model freezes the vision tower
    for module in model.modules():  # what accelerate's TRANSFORMER_BASED_WRAP does: each decoder layer
        if type(module).__name__ in model._no_split_modules:
            fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return tok, model, torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)


def train_step(model, opt, seed: int) -> None:
    ids = torch.randint(3, 200, (2, 12), generator=torch.Generator().manual_seed(seed))  # same on each rank
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    opt.zero_grad()


def as_trainer(model, opt):
    return SimpleNamespace(model=model, optimizer=opt, accelerator=SimpleNamespace(unwrap_model=lambda m: m))


def main(work: str, result: str) -> None:
    PartialState(cpu=True)  # initialises gloo; what `accelerate launch` sets up for the real code
    rank, work = dist.get_rank(), Path(work)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    tok, a, opt_a = sharded_model(mesh)
    train_step(a, opt_a, seed=1)
    found = {"sharded": sharding.is_sharded(a)}

    # stateNNN/: the main process writes full tensors; every process reads them back into a fresh model
    tensors, meta = export_optimizer(as_trainer(a, opt_a))
    names = [n for n, p in a.named_parameters() if p.requires_grad]
    if rank == 0:
        found["exported_shapes_full"] = all(
            tuple(tensors[f"master/{n}"].shape) == tuple(p.shape)
            for n, p in a.named_parameters()
            if n in names
        )  # DTensor.shape is the full (global) shape
        found["exported"] = sorted({k.split("/")[0] for k in tensors})
        save_state(work / "state001", tensors=tensors, meta=meta)
    dist.barrier()
    tensors, meta = load_state(work / "state001")
    _, b, opt_b = sharded_model(mesh)  # different from `a` until the state is loaded
    load_masters_into_model(b, tensors)
    import_optimizer(as_trainer(b, opt_b), tensors, meta)
    train_step(a, opt_a, seed=2)
    train_step(b, opt_b, seed=2)
    pa, pb = sharding.full_parameters(a), sharding.full_parameters(b)
    sa, sb = sharding.full_adamw_state(a, opt_a), sharding.full_adamw_state(b, opt_b)
    if rank == 0:
        found["resumed_params_equal"] = pa.keys() == pb.keys() and all(pa[k].equal(pb[k]) for k in pa)
        found["resumed_state_equal"] = sa.keys() == sb.keys() and all(
            sa[k][x].equal(sb[k][x]) for k in sa for x in ("step", "exp_avg", "exp_avg_sq")
        )
        found["params_moved"] = not all(pa[k].equal(tensors[f"master/{k}"]) for k in names)

    # evaluation of the sharded model: all processes gather, the main one generates
    tasks = [{"id": f"t{i}", "problem": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(3)]
    spec = EvalSpec(cap=12, temperature=1.0, top_p=1.0, seed=7, samples={"fixed32": 2}, batch_size=4)
    grader = TextGrader()
    callback = EvalCallback(
        work, {"fixed32": tasks}, spec, eval_every=1, tokenizer=tok, grade_fn=grader.grade_batch
    )
    callback.evaluate(a, step=2)
    if rank == 0:  # the same weights, unsharded, evaluated directly
        _, plain = tiny_random_model()
        plain.load_state_dict(pa, strict=False)
        expected = run_eval(
            checkpoint_weights(plain), tok, {"fixed32": tasks}, spec, 2, grade_fn=grader.grade_batch
        )
        got = read_jsonl(work / "results" / "eval_step002.jsonl")
        found["eval_rows"] = len(got)
        found["eval_equal"] = got == json.loads(json.dumps(expected))
        Path(result).write_text(json.dumps(found))
    dist.barrier()  # leave together: a process exiting while the other holds the gloo group can abort it
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
