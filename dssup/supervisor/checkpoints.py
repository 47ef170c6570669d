"""Find the latest *complete* checkpoint in a directory; never hand out a partial one.

A failed attempt may die while saving, so the newest directory is often incomplete. What
"complete" means depends on the format:

* torch DCP: the directory holds ``.metadata`` (DCP writes it last);
* Hugging Face ``checkpoint-N``: ``trainer_state.json`` plus model weights;
* DeepSpeed: ``latest`` names a tag whose directory has the model states and one optimizer
  shard per data-parallel rank ``0..n-1`` (all present); when ``latest`` points at an
  incomplete tag, older complete tags are used;
* a user pattern (``--checkpoint-pattern``): any matching non-empty file or non-empty directory.

The step (progress measure) is the last integer in the name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CheckpointRef", "find_latest"]

_INT = re.compile(r"(\d+)(?!.*\d)")
_DS_OPTIM = re.compile(r"zero_pp_rank_(\d+)_mp_rank_\d+_optim_states\.pt$")
_DS_MODEL = re.compile(r"(mp_rank_\d+|zero_pp_rank_\d+_mp_rank_\d+)_model_states\.pt$")
_HF_WEIGHTS = (
    "model.safetensors",
    "pytorch_model.bin",
    "model.safetensors.index.json",
    "pytorch_model.bin.index.json",
    "adapter_model.safetensors",
    "adapter_model.bin",
)


@dataclass(frozen=True)
class CheckpointRef:
    path: Path
    step: int
    format: str  # dcp, hf, deepspeed, pattern


def _step(name: str) -> int | None:
    m = _INT.search(name)
    return int(m.group(1)) if m else None


def _deepspeed_complete(tag: Path, dp: int | None) -> bool:
    if not tag.is_dir():
        return False
    names = [p.name for p in tag.iterdir()]
    if not any(_DS_MODEL.search(n) for n in names):
        return False
    shards = {int(m.group(1)) for n in names if (m := _DS_OPTIM.search(n))}
    if not shards:
        return True  # ZeRO-0: model states hold everything
    expected = dp if dp is not None else max(shards) + 1
    return shards >= set(range(expected))


def _deepspeed(root: Path, dp: int | None) -> list[CheckpointRef]:
    latest = root / "latest"
    if not latest.is_file():
        return []
    tag = latest.read_text().strip()
    candidates = [
        root / tag,
        *sorted(
            (p for p in root.iterdir() if p.is_dir() and p.name != tag),
            key=lambda p: _step(p.name) or -1,
            reverse=True,
        ),
    ]
    for cand in candidates:
        if _deepspeed_complete(cand, dp) and (step := _step(cand.name)) is not None:
            return [CheckpointRef(cand, step, "deepspeed")]
    return []


def _is_dcp(path: Path) -> bool:
    return (path / ".metadata").is_file()


def _is_hf(path: Path) -> bool:
    return (path / "trainer_state.json").is_file() and any((path / w).exists() for w in _HF_WEIGHTS)


def _scan(root: Path) -> list[CheckpointRef]:
    found = []
    for child in [root, *(p for p in root.iterdir() if p.is_dir())]:
        step = _step(child.name)
        if step is None:
            continue
        if _is_dcp(child):
            found.append(CheckpointRef(child, step, "dcp"))
        elif child.name.startswith("checkpoint-") and _is_hf(child):
            found.append(CheckpointRef(child, step, "hf"))
    return found


def _pattern(root: Path, pattern: str) -> list[CheckpointRef]:
    found = []
    for path in root.glob(pattern):
        ok = path.stat().st_size > 0 if path.is_file() else any(path.iterdir())
        if ok and (step := _step(path.name)) is not None:
            found.append(CheckpointRef(path, step, "pattern"))
    return found


def find_latest(
    root: Path | None, pattern: str | None = None, dp: int | None = None
) -> CheckpointRef | None:
    """The complete checkpoint with the highest step under ``root``, or None."""
    if root is None or not root.is_dir():
        return None
    refs = _pattern(root, pattern) if pattern else [*_deepspeed(root, dp), *_scan(root)]
    return max(refs, key=lambda r: (r.step, str(r.path)), default=None)
