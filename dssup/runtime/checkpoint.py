"""Exact torch DCP checkpoints: model, optimizer moments and the trainer's position.

A plain ``dcp.load`` into a fresh optimizer silently skips Adam's moments (a new optimizer's
``state_dict()`` has none), so resuming through it changes the trajectory. Going through
``get_state_dict``/``set_state_dict`` restores them; with the step counter saved alongside, a
resumed run continues at the right sample and ends with the same weights. Each checkpoint is a
directory ``step_<N>`` whose ``.metadata`` file DCP writes last: the supervisor treats a
directory without it as partial and never resumes from it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

__all__ = ["load_checkpoint", "save_checkpoint", "step_dir", "step_of"]

_STEP = re.compile(r"step_(\d+)$")


def step_dir(root: Path, step: int) -> Path:
    return root / f"step_{step:08d}"


def step_of(path: Path) -> int | None:
    match = _STEP.search(path.name)
    return int(match.group(1)) if match else None


def save_checkpoint(root: Path, step: int, model: Any, optimizer: Any) -> Path:
    """Collective: every rank calls it. Returns the checkpoint directory."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    target = step_dir(root, step)
    state = {"model": model_sd, "optim": optim_sd, "trainer": {"step": torch.tensor(step)}}
    dcp.save(state, checkpoint_id=str(target))  # type: ignore[attr-defined]
    return target


def load_checkpoint(path: Path, model: Any, optimizer: Any) -> int:
    """Collective: restore model and optimizer in place; returns the step to continue from."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    trainer = {"step": torch.tensor(0)}
    state: dict[str, Any] = {"model": model_sd, "optim": optim_sd, "trainer": trainer}
    dcp.load(state, checkpoint_id=str(path))  # type: ignore[attr-defined]
    set_state_dict(model, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)
    return int(trainer["step"].item())
