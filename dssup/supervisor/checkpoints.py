"""Find the latest *complete* checkpoint in a directory; never hand out a partial one.

A failed attempt may die while saving, so the newest directory is often incomplete. What
"complete" means depends on the format:

* torch DCP: the directory holds ``.metadata`` (DCP writes it last);
* Hugging Face ``checkpoint-N``: ``trainer_state.json`` plus model weights;
* DeepSpeed: ``latest`` names a tag whose directory has the model states and one optimizer
  shard per data-parallel rank ``0..n-1`` (all present); when ``latest`` points at an
  incomplete tag, older complete tags are used;
* Megatron: ``latest_checkpointed_iteration.txt`` (written after the save) names ``iter_N``;
* ``torch.save`` files named ``step-N.pt``, ``step_N.pt``, ``<name>_N.pt``/``-N.pth``/``.ckpt``
  (Lightning's ``epoch=E-step=N.ckpt`` too, also under ``lightning_logs/version_*/checkpoints``),
  and a ``latest.pt`` link to one of them: a zip-format file (torch's default) is complete when
  its end-of-central-directory record is there; an older pickle file when it is not empty;
* a user pattern (``--checkpoint-pattern``): any matching non-empty file or non-empty directory.

The step (progress measure) is the last integer in the name. A directory that holds files but
no checkpoint dssup recognises is explained by ``unrecognised`` (with the hint to pass a
pattern), so a relaunch never silently starts from step 0.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CheckpointRef", "find_latest", "unrecognised"]

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


def _megatron(root: Path) -> list[CheckpointRef]:
    try:
        text = (root / "latest_checkpointed_iteration.txt").read_text().strip()
    except OSError:
        return []
    if not text.isdigit():
        return []  # "release" (a converted model), not a training checkpoint
    tag = root / f"iter_{int(text):07d}"
    return [CheckpointRef(tag, int(text), "megatron")] if tag.is_dir() else []


_TORCH_FILE = re.compile(r"(?:^|[-_=])(?:step[-_=]?)?(\d+)\.(?:pt|pth|ckpt|bin)$")
_EOCD = (b"PK\x05\x06", b"PK\x06\x06")


def _torch_file_complete(path: Path) -> bool:
    """A zip-format ``torch.save`` file ends with its central directory; a pickle one is
    accepted when it is not empty (its end cannot be checked without unpickling it)."""
    try:
        size = path.stat().st_size
        if size == 0:
            return False
        with open(path, "rb") as fh:
            head = fh.read(4)
            if head != b"PK\x03\x04":
                return True
            fh.seek(max(0, size - 66_000))
            tail = fh.read()
    except OSError:
        return False
    return any(sig in tail for sig in _EOCD)


def _torch_files(root: Path) -> list[CheckpointRef]:
    dirs = [root, *sorted(root.glob("lightning_logs/version_*/checkpoints"))]
    found = []
    for d in dirs:
        for path in d.iterdir():
            target = path.resolve() if path.is_symlink() else path
            m = _TORCH_FILE.search(target.name)
            if m and target.is_file() and _torch_file_complete(target):
                found.append(CheckpointRef(target, int(m.group(1)), "torch-save"))
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
    if pattern:
        refs = _pattern(root, pattern)
    else:
        refs = [*_deepspeed(root, dp), *_scan(root), *_megatron(root), *_torch_files(root)]
    return max(refs, key=lambda r: (r.step, str(r.path)), default=None)


KNOWN = (
    "DCP directories with .metadata, HF checkpoint-N, DeepSpeed tags named by 'latest', "
    "Megatron iter_N with latest_checkpointed_iteration.txt, torch.save files named like "
    "step-N.pt or name_N.pt (latest.pt links), Lightning *step=N.ckpt"
)


def unrecognised(root: Path | None, pattern: str | None = None) -> str | None:
    """Why a non-empty checkpoint directory yields no checkpoint, with the fix; else None."""
    if root is None or not root.is_dir() or find_latest(root, pattern) is not None:
        return None
    entries = sorted(p.name for p in root.iterdir())
    if not entries:
        return None
    shown = ", ".join(entries[:6]) + (", ..." if len(entries) > 6 else "")
    if pattern:
        return f"nothing in {root} ({shown}) matches --checkpoint-pattern {pattern!r} as a complete checkpoint"
    return (
        f"dssup recognises no complete checkpoint in {root} (it holds {shown}); it knows "
        f"{KNOWN}; pass --checkpoint-pattern 'GLOB' (the step is the last number in the name)"
    )
