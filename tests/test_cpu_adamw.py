"""CPUAdamW against torch.optim.AdamW, bitwise: the same elementwise kernels run in the same order on the
same fp32 values (chunking only regroups elements), so any difference at all is a bug."""

import copy
import io

import pytest
import torch

from engine.cpu_adamw import CPUAdamW
from rundir.state import load_state, save_state

HYPER = dict(lr=1e-2, betas=(0.8, 0.95), eps=1e-6)


def make_model(dtype=torch.float32, device="cpu"):
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(37, 300), torch.nn.ReLU(), torch.nn.Linear(300, 101), torch.nn.Linear(101, 3)
    ).to(dtype=dtype, device=device)


def groups(model, named=True):
    """Two groups, as the HF Trainer builds them: weights with decay, biases without."""
    pairs = list(model.named_parameters())
    pick = [lambda n: n.endswith("weight"), lambda n: not n.endswith("weight")]
    return [
        {"params": [(n, p) if named else p for n, p in pairs if f(n)], "weight_decay": wd}
        for f, wd in zip(pick, (0.1, 0.0))
    ]


def backward(model, step):
    model.zero_grad(set_to_none=True)
    x = torch.randn(16, 37, generator=torch.Generator().manual_seed(step)).to(next(model.parameters()).dtype)
    model(x.to(next(model.parameters()).device)).float().square().mean().backward()
    if step == 2:
        model[0].bias.grad = None  # skipped this step: no decay, no moment update, its step count lags


def run(model, opt, steps, resume=None):
    """`resume` = (tensors, meta) from a save, loaded in the HF Trainer's order: scheduler, optimizer, scheduler state."""
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1 / (1 + s))
    if resume:
        opt.import_state(resume[0], resume[1]["optimizer"])
        sched.load_state_dict(resume[1]["scheduler"])
    for step in range(sched.last_epoch, sched.last_epoch + steps):
        backward(model, step)
        opt.step()
        sched.step()
    return sched


def beside_torch_adamw(model, opt, device: str, **ref_kw) -> list[torch.Tensor]:
    """Three steps of `opt` on the bf16 `model` and of torch's AdamW on an fp32 copy of it on `device`, fed the
    same grads; the copy's parameters, the trajectory the masters must follow."""
    shadow_model = copy.deepcopy(model).float().to(device)
    shadow = list(shadow_model.parameters())
    ref = torch.optim.AdamW(groups(shadow_model, named=False), **HYPER, **ref_kw)
    for step in range(3):
        backward(model, step)
        for s, p in zip(shadow, model.parameters()):
            s.grad = None if p.grad is None else p.grad.float().to(device)
        opt.step()
        ref.step()
    return shadow


# 4099: odd, splits params and batches across chunks; stage_all runs the GPU path's staging ring on the CPU,
# ring_slots=1 and 2 reuse each slot many times within a step (30k+ elements over 4099-element batches)
@pytest.mark.parametrize(
    "chunk_elems,stage_all,ring_slots",
    [(2**20, False, 4), (4099, False, 4), (4099, True, 1), (4099, True, 2)],
)
def test_matches_torch_adamw_bitwise(chunk_elems, stage_all, ring_slots):
    ref_model, model = make_model(), make_model()
    ref = torch.optim.AdamW(groups(ref_model, named=False), **HYPER)
    opt = CPUAdamW(
        groups(model), **HYPER, chunk_elems=chunk_elems, stage_all=stage_all, ring_slots=ring_slots
    )
    storage = [p.data_ptr() for p in model.parameters()]
    ref_sched = torch.optim.lr_scheduler.LambdaLR(ref, lambda s: 1 / (1 + s))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1 / (1 + s))
    for step in range(5):
        for m, o, s in ((ref_model, ref, ref_sched), (model, opt, sched)):
            backward(m, step)
            o.step()
            s.step()
        for p_ref, p in zip(ref_model.parameters(), model.parameters()):
            assert torch.equal(p_ref, p), f"step {step}"
            assert torch.equal(ref.state[p_ref]["exp_avg"], opt.state[p]["exp_avg"])
            assert torch.equal(ref.state[p_ref]["exp_avg_sq"], opt.state[p]["exp_avg_sq"])
            assert ref.state[p_ref]["step"].item() == opt.state[p]["step"]
    assert opt.state[model[0].bias]["step"] == 4 and opt.state[model[0].weight]["step"] == 5
    # updated in place: compiled generation's CUDA graphs read the parameters at these addresses
    assert [p.data_ptr() for p in model.parameters()] == storage
    if stage_all:  # the ring is bounded: ring_slots buffers of chunk_elems, whatever the model's size
        assert len(opt._ring) == ring_slots and all(
            b.numel() == chunk_elems for s in opt._ring for b in s.values()
        )


def test_bf16_params_through_the_ring_hold_the_cast_masters():
    model = make_model(torch.bfloat16)
    shadow_model = copy.deepcopy(model).float()
    opt = CPUAdamW(groups(model), **HYPER, chunk_elems=4099, stage_all=True, ring_slots=2)
    ref = torch.optim.AdamW(groups(shadow_model, named=False), **HYPER)
    for step in range(3):
        backward(model, step)
        for s, p in zip(shadow_model.parameters(), model.parameters()):
            s.grad = None if p.grad is None else p.grad.float()
        opt.step()
        ref.step()
    for s, p in zip(shadow_model.parameters(), model.parameters()):
        assert torch.equal(opt.state[p]["master"], s) and torch.equal(p, s.to(torch.bfloat16))


def test_bf16_model_holds_the_cast_fp32_masters():
    model = make_model(torch.bfloat16)
    opt = CPUAdamW(groups(model), **HYPER)
    shadow = beside_torch_adamw(model, opt, "cpu")
    for s, p in zip(shadow, model.parameters()):
        master = opt.state[p]["master"]
        assert master.dtype == torch.float32 and master.device.type == "cpu"
        assert torch.equal(master, s)  # the fp32 trajectory AdamW would take from the bf16 grads
        assert torch.equal(p, master.to(torch.bfloat16))
    assert any(not torch.equal(s, s.to(torch.bfloat16).float()) for s in shadow)  # masters hold more bits


def test_export_import_resumes_exactly_through_state_shards(tmp_path):
    straight = make_model()
    run(straight, CPUAdamW(groups(straight), **HYPER), 5)

    first = make_model()
    opt = CPUAdamW(groups(first), **HYPER)
    sched = run(first, opt, 3)
    tensors, meta = opt.export_state()
    assert all(t.dtype == torch.float32 for t in tensors.values())
    meta = {"optimizer": meta, "scheduler": sched.state_dict()}
    save_state(tmp_path / "state003", tensors=tensors, meta=meta, shard_bytes=50_000)

    resumed = make_model()
    with torch.no_grad():
        for p in resumed.parameters():
            p.zero_()  # import_state must restore the weights from the masters
    opt2 = CPUAdamW(groups(resumed), **HYPER)
    run(resumed, opt2, 2, resume=load_state(tmp_path / "state003"))
    for p, q in zip(straight.parameters(), resumed.parameters()):
        assert torch.equal(p, q)


def test_import_into_a_stepped_optimizer_rewinds_it():
    model = make_model(torch.bfloat16)
    opt = CPUAdamW(groups(model), **HYPER)
    run(model, opt, 2)
    tensors, meta = opt.export_state()
    tensors = {k: v.clone() for k, v in tensors.items()}  # export gives the live state
    meta = copy.deepcopy(meta)
    run(model, opt, 2)
    opt.import_state(tensors, meta)
    assert opt.export_state()[1] == meta
    for name, p in model.named_parameters():
        assert torch.equal(opt.state[p]["exp_avg"], tensors[f"exp_avg/{name}"])
        assert torch.equal(p, tensors[f"master/{name}"].to(torch.bfloat16))


def test_import_refuses_mismatched_state():
    model = make_model()
    opt = CPUAdamW(groups(model), **HYPER)
    run(model, opt, 1)
    tensors, meta = opt.export_state()
    bad = dict(tensors)
    bad["exp_avg/0.weight"] = torch.zeros(3, 3)
    with pytest.raises(ValueError, match=r"exp_avg/0\.weight"):
        opt.import_state(bad, meta)
    del bad["exp_avg/0.weight"]
    with pytest.raises(ValueError, match=r"exp_avg/0\.weight.*missing"):
        opt.import_state(bad, meta)
    renamed = {
        **meta,
        "param_groups": [{**meta["param_groups"][0], "param_names": ["x"]}, meta["param_groups"][1]],
    }
    with pytest.raises(ValueError, match=r"param_groups\[0\]\.param_names"):
        opt.import_state(tensors, renamed)
    with pytest.raises(ValueError, match="format"):
        opt.import_state(tensors, {**meta, "format": "other"})


def test_needs_named_parameters():
    with pytest.raises(ValueError, match="named parameters"):
        CPUAdamW(make_model().parameters())


def test_state_dict_round_trips_through_torch_save_weights_only():
    model = make_model()
    opt = CPUAdamW(groups(model), **HYPER)
    assert opt.state_dict() == {"tensors": {}, "meta": {}}  # lazy: accelerate's prepare() moves nothing
    run(model, opt, 2)
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    buf.seek(0)
    other = make_model()
    opt2 = CPUAdamW(groups(other), **HYPER)
    opt2.load_state_dict(torch.load(buf, weights_only=True))
    for p, q in zip(model.parameters(), other.parameters()):
        assert torch.equal(p, q)
        assert torch.equal(opt.state[p]["exp_avg_sq"], opt2.state[q]["exp_avg_sq"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_bf16_params_with_host_state():
    model = make_model(torch.bfloat16, "cuda")
    opt = CPUAdamW(groups(model), **HYPER, chunk_elems=4099)
    shadow = beside_torch_adamw(model, opt, "cpu")
    for s, p in zip(shadow, model.parameters()):
        assert opt.state[p]["master"].device.type == "cpu" and p.device.type == "cuda"
        assert torch.equal(opt.state[p]["master"], s)
        assert torch.equal(p.cpu(), s.to(torch.bfloat16))
    # page-locked, so the copies really are asynchronous
    assert all(b.is_pinned() for slot in opt._ring for b in slot.values())


def test_state_on_the_parameters_device_matches_torch_adamw_and_resumes_exactly():
    # on a CPU "on the device" is the host, unstaged: the logic the GPU-resident mode runs, over many batches
    ref_model, model = make_model(), make_model()
    ref = torch.optim.AdamW(groups(ref_model, named=False), **HYPER)
    opt = CPUAdamW(groups(model), **HYPER, chunk_elems=4099, on_device=True)
    for step in range(3):
        for m, o in ((ref_model, ref), (model, opt)):
            backward(m, step)
            o.step()
    assert all(torch.equal(a, b) for a, b in zip(ref_model.parameters(), model.parameters()))
    tensors, meta = opt.export_state()
    again = make_model()
    resumed = CPUAdamW(groups(again), **HYPER, chunk_elems=4099, on_device=True)
    resumed.import_state({k: v.clone() for k, v in tensors.items()}, meta)
    for m, o in ((model, opt), (again, resumed)):
        backward(m, 3)
        o.step()
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters()))
    with pytest.raises(ValueError, match="on_device state stages nothing"):
        CPUAdamW(groups(make_model()), **HYPER, on_device=True, stage_all=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_bf16_params_with_device_state_match_torch_adamw_on_the_gpu():
    model = make_model(torch.bfloat16, "cuda")
    opt = CPUAdamW(groups(model), **HYPER, chunk_elems=4099, on_device=True)
    shadow = beside_torch_adamw(model, opt, "cuda", foreach=True)  # torch's AdamW runs the same ops there
    for s, p in zip(shadow, model.parameters()):
        assert opt.state[p]["master"].device.type == "cuda"
        assert torch.equal(opt.state[p]["master"], s)
        assert torch.equal(p, s.to(torch.bfloat16))
    assert not opt._ring[0]  # nothing staged through host buffers
    tensors, _ = opt.export_state()
    assert all(t.device.type == "cpu" for t in tensors.values())  # saved from host copies
