"""Which phase of a training step holds the allocator peak, and what is alive then.

Both measured paths (the reference blocks in ``dssup.runtime.reference`` and the user's own
model code in ``dssup.runtime.traced``) run their steps under ``PhaseTracker``, a PyTorch
``MemTracker`` that also remembers the phase (forward, backward, optimizer) and step at which the
device peak rose, every phase's own peak, and the *end of backward*: the peak from the moment the
first block's output gradient is complete to the optimizer step.

With ``log_tensors`` it also keeps, for every storage it sees, the operator and module that
created it, and which storages were alive at the peak: the breakdown a profile keeps so a user
sees which tensors dominate. It relies on MemTracker's storage bookkeeping (``_update_snap``,
``_update_peak_stats``, ``_curr_mem_snap``), private to torch: torch is pinned (2.13.0) and the
measurement tests fail when it changes.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import nn
from torch.distributed._tools.mem_tracker import MemTracker

from dssup.errors import DssupError

__all__ = [
    "DEVICE",
    "TOLERANCE_BYTES",
    "MeasurementMismatch",
    "Phase",
    "PhaseTracker",
    "plain",
]

Phase = Literal["forward", "backward", "optimizer"]

# Scalars the autograd engine and optimizer create outside the dispatch mode (a few bytes each)
# are seen by the profiler only; anything beyond this is a real disagreement.
TOLERANCE_BYTES = 4096

# The accelerator of a measured run (an offloaded optimizer of the reference lives on meta).
DEVICE = torch.device("cpu")


class MeasurementMismatch(DssupError):
    """MemTracker and torch.profiler disagree about a real run's peak: neither can be trusted."""


def plain(snap: dict[Any, int]) -> dict[str, int]:
    """A MemTracker snapshot with string keys (``Total``, ``Activation``, ...)."""
    return {str(getattr(k, "value", k)): v for k, v in snap.items()}


class PhaseTracker(MemTracker):
    """MemTracker that remembers which phase and step were running when the device peak rose
    (the host of an offloaded optimizer is tracked by MemTracker too, but not here)."""

    def __init__(
        self, log_tensors: bool = False, per_module: bool = True, timelines: bool = False
    ) -> None:
        super().__init__()
        # label -> (total, gradient bytes) over the window's start after every op: every moment
        # that can hold a peak (calibration fits each one)
        self.timelines: dict[str, list[tuple[int, int, str]]] | None = {} if timelines else None
        self._last_op = ""
        # False: no per-module statistics (nothing here reads them; a third of a fake trace's
        # time): MemTracker's module hooks do nothing but the device totals are the same.
        self.per_module = per_module
        self.phase: Phase = "forward"
        self.step = 0
        self.peak_at: tuple[Phase, int] = ("forward", 0)
        self.phase_peaks: dict[str, dict[str, int]] = {}
        self.in_tail = False  # set when the first block's output gradient is complete
        self.tail_peaks: dict[str, dict[str, int]] = {}
        self.log_tensors = log_tensors
        self.labels: dict[int, str] = {}  # id(winfo) -> "op @ module"
        self.events: list[tuple[int, int, Any]] = []  # (+1 | -1, bytes, winfo)
        self.peak_event = 0  # len(events) when the device peak last rose
        self.fb_peak, self.fb_peak_event = 0, 0  # the same for the forward/backward peak
        self.module_stack: list[str] = []
        self._op = ""
        self.window = ""  # the running window of the step (see ``mark``)
        self.windows: dict[str, dict[str, dict[str, int]]] = {}
        self.window_events: dict[str, list[int]] = {}  # label -> [first, last) event index
        self.handles: list[Any] = []  # hooks on the model, removed by ``close``

    def watch_tail(self, first_block: nn.Module) -> None:
        """Start the end-of-backward window when ``first_block``'s output gradient exists."""

        def mark(_grad: torch.Tensor) -> None:
            self.in_tail = self.phase == "backward"

        def hook(_mod: nn.Module, _args: Any, out: Any) -> None:
            if isinstance(out, tuple | list) and out and isinstance(out[0], torch.Tensor):
                out = out[0]
            if isinstance(out, torch.Tensor) and out.requires_grad and self.phase == "forward":
                out.register_hook(mark)  # type: ignore[no-untyped-call]

        self.handles.append(first_block.register_forward_hook(hook))

    def mark(self, label: str) -> None:
        """End the running window and start ``label``. A window keeps the device categories at
        its start, at its own peak and at its end (the last step's windows are kept)."""
        if label == self.window:
            return
        now = plain(self._curr_mem_snap.get(DEVICE, {"Total": 0}))
        if self.window:
            self.windows[self.window]["end"] = now
            self.window_events[self.window][1] = len(self.events)
        self.window = label
        self.windows[label] = {"start": now, "peak": now, "end": now}
        if self.timelines is not None:
            self.timelines[label] = []
        self.window_events[label] = [len(self.events), len(self.events)]

    def watch_blocks(self, blocks: list[nn.Module]) -> None:
        """Windows of each repeated block: ``fwd:block:i`` (its forward), ``fwd:after:i``
        (until the next block starts: final norm, head and loss after the last), and in backward
        ``bwd:block:i`` from the moment the gradient of block i's output is complete until that of
        its input is (its recompute included), ``bwd:embed`` after block 0's."""

        def on_grad(label: str) -> Any:
            def hook(_grad: torch.Tensor) -> None:
                if self.phase == "backward":
                    self.mark(label)

            return hook

        def first_grad_tensor(args: Any, kwargs: Any) -> torch.Tensor | None:
            for x in (*args, *kwargs.values()):
                if isinstance(x, torch.Tensor) and x.requires_grad:
                    return x
            return None

        for i, block in enumerate(blocks):

            def pre(_m: nn.Module, args: Any, kwargs: Any, i: int = i) -> None:
                if self.phase != "forward":
                    return  # a checkpointed block recomputing inside its backward window
                self.mark(f"fwd:block:{i}")
                x = first_grad_tensor(args, kwargs)
                if x is not None:
                    x.register_hook(on_grad(f"bwd:block:{i - 1}" if i else "bwd:embed"))  # type: ignore[no-untyped-call]

            def post(_m: nn.Module, _args: Any, _kwargs: Any, out: Any, i: int = i) -> None:
                if self.phase != "forward":
                    return
                self.mark(f"fwd:after:{i}")
                y = out[0] if isinstance(out, tuple | list) and out else out
                if isinstance(y, torch.Tensor) and y.requires_grad:
                    y.register_hook(on_grad(f"bwd:block:{i}"))  # type: ignore[no-untyped-call]

            self.handles.append(block.register_forward_pre_hook(pre, with_kwargs=True))
            self.handles.append(block.register_forward_hook(post, with_kwargs=True))

    def name_modules(self, model: nn.Module) -> None:
        """Keep the stack of running modules (forward) so created tensors can be labelled."""
        if not self.log_tensors:
            return
        for name, mod in model.named_modules():
            n = name or "<model>"
            self.handles.append(mod.register_forward_pre_hook(lambda *_a, n=n: self._push(n)))
            self.handles.append(mod.register_forward_hook(lambda *_a: self._pop()))

    def close(self) -> None:
        """Remove every hook this tracker put on a model (a reused model gets new ones)."""
        for h in self.handles:
            h.remove()
        self.handles.clear()

    def _push(self, name: str) -> None:
        self.module_stack.append(name)

    def _pop(self) -> None:
        if self.module_stack:
            self.module_stack.pop()

    def track_external(self, *external: Any) -> None:
        super().track_external(*external)
        if not self.per_module:  # gradients are tagged by hooks the module hooks would install
            for obj in external:
                if isinstance(obj, nn.Module):
                    self._track_module_params_and_buffers(obj, install_grad_hooks=True)

    def _pre_fw_hook(self, module: nn.Module, inputs: Any) -> None:
        if self.per_module:
            super()._pre_fw_hook(module, inputs)

    def _post_fw_hook(self, module: nn.Module, inputs: Any, outputs: Any) -> None:
        if self.per_module:
            super()._post_fw_hook(module, inputs, outputs)

    def _pre_bw_hook(self, module: nn.Module, args: Any) -> None:
        if self.per_module:
            super()._pre_bw_hook(module, args)

    def _post_bw_hook(self, module: nn.Module, args: Any) -> None:
        if self.per_module:
            super()._post_bw_hook(module, args)

    def _update_snap(self, u_type: Any, winfo: Any, *args: Any, **kwargs: Any) -> None:
        super()._update_snap(u_type, winfo, *args, **kwargs)
        if not (self.log_tensors or self.timelines is not None) or winfo.device != DEVICE:
            return
        kind = getattr(u_type, "name", str(u_type))
        if kind == "ADD":
            if self.log_tensors:
                where = self.module_stack[-1] if self.module_stack else "-"
                ref = str(getattr(winfo.reftype, "value", winfo.reftype))
                label = (
                    f"{self._op} @ {where} ({self.phase})"
                    if self._op
                    else f"{ref} (before the step)"
                )
                self.labels.setdefault(id(winfo), label)
            self.events.append((1, winfo.mem_consumed, winfo))
        elif kind == "DEL":
            self.events.append((-1, winfo.mem_consumed, winfo))

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if self.log_tensors:
            self._op = str(getattr(func, "__name__", func))
        if self.timelines is not None:
            self._last_op = func.__name__
            win = self.windows.get(self.window)
            if win is not None and "first" not in win:  # what was alive before its first op
                win["first"] = plain(self._curr_mem_snap.get(DEVICE, {"Total": 0}))
        return super().__torch_dispatch__(func, types, args, kwargs)  # type: ignore[no-untyped-call]

    def _update_peak_stats(self, peak_state: Any) -> None:
        before = self._peak_mem.get(DEVICE, 0)
        if self.per_module:
            super()._update_peak_stats(peak_state)
        else:  # MemTracker's device peak without its per-module loop (a third of a fake trace)
            for dev, dev_snap in self._curr_mem_snap.items():
                if self._peak_mem.get(dev, 0) < dev_snap["Total"]:
                    self._peak_mem[dev] = dev_snap["Total"]
                    self._peak_mem_snap[dev] = dict(dev_snap)
        if self._peak_mem.get(DEVICE, 0) != before:
            self.peak_at = (self.phase, self.step)
            self.peak_event = len(self.events)
        snap = self._curr_mem_snap.get(DEVICE)
        if snap is not None and self.phase != "optimizer" and snap["Total"] > self.fb_peak:
            self.fb_peak, self.fb_peak_event = snap["Total"], len(self.events)
        if snap is not None:
            key = f"{self.step}:{self.phase}"
            best = self.phase_peaks.get(key)
            if best is None or snap["Total"] > best["Total"]:
                self.phase_peaks[key] = plain(snap)
            if self.window:
                win = self.windows[self.window]
                if snap["Total"] > win["peak"]["Total"]:
                    win["peak"] = plain(snap)
                if self.timelines is not None:
                    grads = sum(v for k, v in snap.items() if getattr(k, "value", k) == "Gradient")
                    self.timelines[self.window].append(
                        (
                            snap["Total"] - win["start"]["Total"],
                            grads - win["start"].get("Gradient", 0),
                            self._last_op,
                        )
                    )
            tail = self.tail_peaks.get(str(self.step))
            if self.in_tail and (tail is None or snap["Total"] > tail["Total"]):
                self.tail_peaks[str(self.step)] = plain(snap)

    def freed_in(self, label: str) -> dict[str, int]:
        """Bytes freed during window ``label`` by the earlier window of the same step that
        created them (events are kept with ``log_tensors`` or ``timelines``)."""
        first, last = self.window_events.get(label, [0, 0])
        made: dict[int, str] = {}
        for lb, (a, b) in self.window_events.items():
            if b <= first:
                for sign, _size, winfo in self.events[a:b]:
                    if sign > 0:
                        made[id(winfo)] = lb
        out: dict[str, int] = {}
        for sign, size, winfo in self.events[first:last]:
            if sign < 0 and id(winfo) in made:
                out[made[id(winfo)]] = out.get(made[id(winfo)], 0) + size
        return out

    def kept_from(self, label: str) -> dict[str, int]:
        """Bytes created in window ``label`` and still alive at its end, by creating module."""
        first, last = self.window_events.get(label, [0, 0])
        alive: dict[int, tuple[int, Any]] = {}
        for sign, size, winfo in self.events[first:last]:
            if sign > 0:
                alive[id(winfo)] = (size, winfo)
            else:
                alive.pop(id(winfo), None)
        out: dict[str, int] = {}
        for key, (size, _w) in alive.items():
            where = self.labels.get(key, "? @ -").split(" @ ", 1)[-1].split(" (", 1)[0]
            out[where] = out.get(where, 0) + size
        return out

    def alive_at_peak(self, top: int = 12, fb: bool = False) -> list[tuple[str, int, int]]:
        """The largest groups of storages alive at the device peak (``fb``: at the forward/
        backward peak), as (label, count, bytes)."""
        alive: dict[int, tuple[int, Any]] = {}
        for sign, size, winfo in self.events[: self.fb_peak_event if fb else self.peak_event]:
            if sign > 0:
                alive[id(winfo)] = (size, winfo)
            else:
                alive.pop(id(winfo), None)
        groups: dict[str, list[int]] = {}
        for key, (size, _w) in alive.items():
            label = self.labels.get(key, "?")
            g = groups.setdefault(label, [0, 0])
            g[0] += 1
            g[1] += size
        ranked = sorted(groups.items(), key=lambda kv: -kv[1][1])[:top]
        return [(label, n, size) for label, (n, size) in ranked]
