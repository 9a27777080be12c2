"""CPU-offloaded AdamW (SPEC §6): bf16 weights and grads on the accelerator, fp32 state in host memory.

Per parameter the host keeps an fp32 master copy and both Adam moments (12 bytes); the device keeps only
the model-dtype parameter and its gradient, so a 9.5B full fine-tune fits one H200 and its host. `step()`
works through cache-sized batches of parameter chunks (<= chunk_elems elements), each through one slot of
a small ring of page-locked host buffers (`ring_slots` x chunk_elems, a few MB in all):

1. the grads of the next `ring_slots` batches are copied into their slots (non_blocking, one event per
   slot), so the CPU computes on one batch while the following ones are in flight;
2. the batch runs exactly the op sequence of `torch.optim.AdamW` (single-tensor and foreach paths agree)
   on the fp32 masters with `torch._foreach_*` ops. Every op is elementwise, so chunking does not change
   a single bit, while each batch stays in cache for the ~10 passes AdamW makes;
3. the new masters, cast to the parameter's dtype, overwrite the grads in the slot and are copied back
   into the parameters in place (non_blocking); the slot's next grad copy is queued behind that copy on
   the same stream. Parameters keep their storage, so CUDA graphs that read them (compiled generation,
   engine/generation.py) see the new weights.

Parameters must be given with names, using torch's own named-parameter support: `params` is an
iterable of `(name, tensor)` pairs or a list of param-group dicts whose "params" are such pairs
(torch then stores `group["param_names"]`). The names key `export_state()` / `import_state()`, the
exact-resume format saved by `rundir.state`.

`on_device=True` keeps the fp32 state beside the parameters instead (GPU-resident: 12 more bytes per parameter
on the device, no host round trip): the same op sequence runs on the parameter's device, over batches of
chunk_elems, and the masters are copied into the parameters in place. The trainer picks it when the memory
estimate that sizes the micro-batch leaves room for it (engine/micro_batch.py), and records the choice.

State is created lazily, for every parameter at once, at the first `step()` or `import_state()`,
masters copied from the current parameter values; a parameter keeps `step == 0` (and is left
untouched, weight decay included) until it first has a grad, which matches torch's per-parameter
step counts. After that the masters are the truth: load new weights through `import_state`.
"""

import weakref
from collections.abc import Iterable

import torch

STATE_FORMAT = "capgrpo.cpu_adamw/1"
_MOMENTS = ("master", "exp_avg", "exp_avg_sq")
_HYPER = ("lr", "betas", "eps", "weight_decay", "initial_lr")  # initial_lr: set by LR schedulers


class CPUAdamW(torch.optim.Optimizer):
    def __init__(
        self,
        params: Iterable,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        *,
        chunk_elems: int = 2**20,
        ring_slots: int = 4,
        stage_all: bool = False,  # stage CPU parameters through the ring too: tests its logic on a CPU
        on_device: bool = False,  # fp32 state on the parameters' device (GPU-resident), nothing staged
    ):
        if lr < 0 or eps < 0 or weight_decay < 0 or not all(0 <= b < 1 for b in betas):
            raise ValueError(
                f"invalid AdamW hyperparameters: lr={lr} betas={betas} eps={eps} wd={weight_decay}"
            )
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))
        if chunk_elems < 1 or ring_slots < 1:
            raise ValueError(
                f"CPUAdamW: chunk_elems and ring_slots must be >= 1, got {chunk_elems}, {ring_slots}"
            )
        if on_device and stage_all:
            raise ValueError("CPUAdamW: on_device state stages nothing; stage_all contradicts it")
        self.chunk_elems, self.ring_slots, self.stage_all = chunk_elems, ring_slots, stage_all
        self.on_device = on_device
        names = []
        for group in self.param_groups:
            if len(group.get("param_names", ())) != len(group["params"]):
                raise ValueError("CPUAdamW needs named parameters: pass (name, tensor) pairs")
            names += group["param_names"]
            for name, p in zip(group["param_names"], group["params"]):
                if not p.is_contiguous():
                    raise ValueError(f"parameter {name!r} is not contiguous")
        if len(set(names)) != len(names):
            raise ValueError("CPUAdamW: duplicate parameter names")
        self._ring: list[dict[torch.dtype, torch.Tensor]] = [
            {} for _ in range(ring_slots)
        ]  # pinned, by dtype

    # --- state ------------------------------------------------------------------------------------
    def _named(self):
        for group in self.param_groups:
            yield from zip(group["param_names"], group["params"])

    def _init_state(self, tensors: dict[str, torch.Tensor] | None = None) -> None:
        """Allocate host state for every parameter: masters from the current values and zero moments,
        or, from import_state, the given tensors themselves (no second copy of 12 bytes per parameter)."""
        if self.state:
            return
        for name, p in self._named():
            device = p.device if self.on_device else "cpu"
            if tensors is None:
                master = p.detach().to(device, torch.float32, copy=True)
                st = {
                    "master": master,
                    "exp_avg": torch.zeros_like(master),
                    "exp_avg_sq": torch.zeros_like(master),
                }
            else:
                st = {k: tensors[f"{k}/{name}"].to(device, torch.float32).contiguous() for k in _MOMENTS}
            self.state[p] = {"step": 0, **st}

    # --- the update -------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._init_state()
        for group in self.param_groups:
            by_step: dict[int, list[torch.Tensor]] = {}
            for p in (p for p in group["params"] if p.grad is not None):
                self.state[p]["step"] += 1
                by_step.setdefault(self.state[p]["step"], []).append(p)
            for step, ps in by_step.items():
                self._update(group, step, ps)
        return loss

    def _staged(self, p: torch.Tensor) -> bool:
        return not self.on_device and (p.device.type != "cpu" or self.stage_all)

    def _fetch(self, batch: list, slot: int) -> tuple[list[torch.Tensor], torch.cuda.Event | None]:
        """Start copying the batch's grads into ring slot `slot`: (grad views to read, event to wait on)."""
        buffers, offsets, views, on_cuda = self._ring[slot], {}, [], False
        for p, a, b in batch:
            grad = p.grad.reshape(-1)[a:b]
            if not self._staged(p):
                views.append(grad)
                continue
            if p.dtype not in buffers:
                buffers[p.dtype] = _pinned_empty(self.chunk_elems, p.dtype)
            start = offsets.get(p.dtype, 0)
            offsets[p.dtype] = start + b - a
            view = buffers[p.dtype][start : start + b - a]
            view.copy_(grad, non_blocking=True)
            views.append(view)
            on_cuda |= p.device.type == "cuda"
        event = None
        if on_cuda:
            event = torch.cuda.Event()
            event.record()
        return views, event

    def _update(self, group: dict, step: int, params: list) -> None:
        lr, (beta1, beta2), eps, wd = float(group["lr"]), group["betas"], group["eps"], group["weight_decay"]
        # scalars computed exactly as torch.optim.adam._single_tensor_adam does
        step_size = lr / (1 - beta1**step)
        bias_correction2_sqrt = (1 - beta2**step) ** 0.5
        device = params[0].device if self.on_device else "cpu"
        scratch_g = torch.empty(self.chunk_elems, dtype=torch.float32, device=device)
        scratch_d = torch.empty(self.chunk_elems, dtype=torch.float32, device=device)
        batches = list(self._batches(params))
        slots = self.ring_slots
        in_flight = {i: self._fetch(batches[i], i % slots) for i in range(min(slots, len(batches)))}
        for i, batch in enumerate(batches):
            grads_in, event = in_flight.pop(i)
            if event is not None:
                event.synchronize()
            masters, exp_avgs, exp_avg_sqs = [], [], []
            for p, a, b in batch:
                st = self.state[p]
                masters.append(st["master"].view(-1)[a:b])
                exp_avgs.append(st["exp_avg"].view(-1)[a:b])
                exp_avg_sqs.append(st["exp_avg_sq"].view(-1)[a:b])
            g, denom, offset = [], [], 0
            for m in masters:
                g.append(scratch_g[offset : offset + m.numel()])
                denom.append(scratch_d[offset : offset + m.numel()])
                offset += m.numel()
            torch._foreach_copy_(g, grads_in)
            if wd != 0:
                torch._foreach_mul_(masters, 1 - lr * wd)
            torch._foreach_lerp_(exp_avgs, g, 1 - beta1)
            torch._foreach_mul_(exp_avg_sqs, beta2)
            torch._foreach_addcmul_(exp_avg_sqs, g, g, value=1 - beta2)
            torch._foreach_copy_(denom, exp_avg_sqs)
            torch._foreach_sqrt_(denom)
            # scalar lists, as torch's foreach AdamW passes them: CUDA divides a list by a single scalar through
            # its reciprocal (one bit less), by a scalar list truly; on a CPU both divide per tensor
            torch._foreach_div_(denom, [bias_correction2_sqrt] * len(denom))
            torch._foreach_add_(denom, eps)
            torch._foreach_addcdiv_(masters, exp_avgs, denom, [-step_size] * len(denom))
            # new weights, cast to the model dtype: over the grads in the slot (read above), or in place
            staged = [self._staged(p) for p, _, _ in batch]
            weights_out = [
                view if s else p.view(-1)[a:b] for view, s, (p, a, b) in zip(grads_in, staged, batch)
            ]
            torch._foreach_copy_(weights_out, masters)
            for view, s, (p, a, b) in zip(grads_in, staged, batch):
                if s:
                    p.view(-1)[a:b].copy_(view, non_blocking=True)
            if i + slots < len(batches):  # queued behind the copies out of this slot
                in_flight[i + slots] = self._fetch(batches[i + slots], i % slots)

    def _batches(self, params: list[torch.Tensor]):
        """Yield batches of chunks (param, start, stop), <= chunk_elems elements per batch."""
        batch, size = [], 0
        for p in params:
            n = p.numel()
            for a in range(0, n, self.chunk_elems):
                b = min(n, a + self.chunk_elems)
                if size + b - a > self.chunk_elems:
                    yield batch
                    batch, size = [], 0
                batch.append((p, a, b))
                size += b - a
        if batch:
            yield batch

    # --- exact-resume state -------------------------------------------------------------------------
    def export_state(self) -> tuple[dict[str, torch.Tensor], dict]:
        """fp32 host tensors keyed "master/<name>", "exp_avg/<name>", "exp_avg_sq/<name>", and JSON meta.

        Host state is returned live (no copy): save it before the next step. Device state is copied to the host.
        """
        self._init_state()
        tensors = {f"{k}/{name}": self.state[p][k].cpu() for name, p in self._named() for k in _MOMENTS}
        groups = [
            {k: list(g[k]) if k == "betas" else g[k] for k in _HYPER if k in g} for g in self.param_groups
        ]
        for out, g in zip(groups, self.param_groups):
            out["param_names"] = list(g["param_names"])
        meta = {"format": STATE_FORMAT, "param_groups": groups,
                "step": {name: self.state[p]["step"] for name, p in self._named()}}  # fmt: skip
        return tensors, meta

    @torch.no_grad()
    def import_state(self, tensors: dict[str, torch.Tensor], meta: dict) -> None:
        """Restore masters, moments, per-parameter steps and group hyperparameters; then write the masters
        (cast to the parameter dtype) into the model parameters. Everything is checked before anything
        changes; a mismatch raises ValueError naming the parameter or field. Before the first step host state
        adopts the fp32 CPU tensors, not copies: the caller's dict then shares the live state."""
        if meta.get("format") != STATE_FORMAT:
            raise ValueError(f"optimizer state format is {meta.get('format')!r}, expected {STATE_FORMAT!r}")
        groups = meta.get("param_groups")
        if not isinstance(groups, list) or len(groups) != len(self.param_groups):
            raise ValueError(
                f"optimizer state has {len(groups or [])} param groups, expected {len(self.param_groups)}"
            )
        for i, (saved, g) in enumerate(zip(groups, self.param_groups)):
            if saved.get("param_names") != g["param_names"]:
                raise ValueError(f"optimizer state param_groups[{i}].param_names differ from the model's")
        steps = meta.get("step", {})
        for name, p in self._named():
            if not isinstance(steps.get(name), int) or steps[name] < 0:
                raise ValueError(f"optimizer state: step of parameter {name!r} missing or invalid")
            for k in _MOMENTS:
                t = tensors.get(f"{k}/{name}")
                if t is None or tuple(t.shape) != tuple(p.shape):
                    found = "missing" if t is None else f"shape {tuple(t.shape)}"
                    raise ValueError(
                        f"optimizer state tensor '{k}/{name}': {found}, expected {tuple(p.shape)}"
                    )
        if self.state:
            for name, p in self._named():
                for k in _MOMENTS:
                    self.state[p][k].copy_(tensors[f"{k}/{name}"])
        else:
            self._init_state(tensors)
        for saved, g in zip(groups, self.param_groups):
            g.update({k: tuple(saved[k]) if k == "betas" else saved[k] for k in _HYPER if k in saved})
        for name, p in self._named():
            self.state[p]["step"] = steps[name]
            p.copy_(self.state[p]["master"])

    # The base class's format would be cast to each parameter's dtype and device (bf16 on the GPU) on
    # load. accelerate's prepare() round-trips state_dict() through the device: lazy state keeps that empty.
    def state_dict(self) -> dict:
        if not self.state:
            return {"tensors": {}, "meta": {}}
        tensors, meta = self.export_state()
        return {"tensors": tensors, "meta": meta}

    def load_state_dict(self, state_dict: dict) -> None:
        if "tensors" not in state_dict or "meta" not in state_dict:
            raise ValueError("not a CPUAdamW state_dict (expected keys 'tensors' and 'meta')")
        if not state_dict["tensors"]:
            return
        self.import_state({k: v.cpu() for k, v in state_dict["tensors"].items()}, state_dict["meta"])


def _pinned_empty(numel: int, dtype: torch.dtype) -> torch.Tensor:
    """Page-locked host buffer. cudaHostRegister on a plain allocation, because the caching host
    allocator behind pin_memory=True rounds every block up to a power of two (32 GB for 18 GB)."""
    buf = torch.empty(numel, dtype=dtype)
    if not torch.cuda.is_available():  # stage_all on a CPU: the ring's logic without page-locking
        return buf
    rt = torch.cuda.cudart()
    if numel and rt.cudaHostRegister(buf.data_ptr(), numel * buf.element_size(), 0) == rt.cudaError.success:
        weakref.finalize(buf, rt.cudaHostUnregister, buf.data_ptr())
    return buf
