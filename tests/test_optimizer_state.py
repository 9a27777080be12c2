"""stateNNN/'s optimizer state (trainer/checkpoint.py): exported and imported, the next step is the same step."""

from types import SimpleNamespace

import pytest
import torch

from rundir.state import load_state, save_state
from trainer.checkpoint import export_optimizer, import_optimizer

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA")),
]


def _as_trainer(model, opt):
    return SimpleNamespace(model=model, optimizer=opt, accelerator=SimpleNamespace(unwrap_model=lambda m: m))


def _step(model, opt, seed: int) -> None:
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(seed)).to(next(model.parameters()).device)
    model(x).square().sum().backward()
    opt.step()
    opt.zero_grad()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fused", [False, True])
def test_an_imported_adamw_takes_the_step_the_original_takes(device, fused, tmp_path):
    """torch's fused AdamW (transformers' default optimizer on CUDA) keeps `step` on the parameter's device: a
    step restored on the CPU made its first update fail on the H200 (docs/experiment-real/README.md, launch 6)."""
    torch.manual_seed(0)
    a = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 1)).to(device)
    b = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 1)).to(device)
    opt_a, opt_b = (torch.optim.AdamW(m.parameters(), lr=0.1, fused=fused) for m in (a, b))
    for seed in (1, 2):
        _step(a, opt_a, seed)
    tensors, meta = export_optimizer(_as_trainer(a, opt_a))
    save_state(tmp_path / "state002", tensors=tensors, meta=meta)  # as a save does: to disk and back
    tensors, meta = load_state(tmp_path / "state002")
    b.load_state_dict({n: tensors[f"master/{n}"] for n, _ in a.named_parameters()})
    import_optimizer(_as_trainer(b, opt_b), tensors, meta)
    reference = torch.optim.AdamW(b.parameters(), lr=0.1, fused=fused)
    reference.load_state_dict(opt_a.state_dict())  # where torch itself puts a restored step
    for p in b.parameters():
        want = reference.state[p]["step"]
        assert (opt_b.state[p]["step"].device, opt_b.state[p]["step"].dtype) == (want.device, want.dtype)
    _step(a, opt_a, 3)
    _step(b, opt_b, 3)
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb)
