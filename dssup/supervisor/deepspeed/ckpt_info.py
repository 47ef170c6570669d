"""What a DeepSpeed checkpoint was saved with, read from the files on disk without torch.

The supervisor must decide whether the next attempt can load a checkpoint directly or needs a
conversion, and it must do so without importing torch (it runs no tensors). A ``.pt`` file is a
zip archive whose ``data.pkl`` holds the object tree; the tensors live in separate records that
the tree only references. Unpickling ``data.pkl`` with every class replaced by an inert stub
gives the plain fields (``global_steps``, ``dp_world_size``, ``ds_config``, ``zero_stage``, ...)
quickly, whatever the checkpoint's size, and never runs code from the file.

Layout read (DeepSpeed 0.19, ``<save_dir>/<tag>/``): ZeRO 0-2 write ``mp_rank_XX_model_states.pt``,
ZeRO-3 one ``zero_pp_rank_<dp>_mp_rank_XX_model_states.pt`` per data-parallel rank, ZeRO 1-3 one
``[bf16_]zero_pp_rank_<dp>_mp_rank_XX_optim_states.pt`` per data-parallel rank; ``latest`` names
the tag.
"""

from __future__ import annotations

import collections
import copyreg
import io
import pickle
import re
import zipfile
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "UNREADABLE",
    "CheckpointInfo",
    "find_latest_complete",
    "read_checkpoint",
    "read_pickled_tree",
    "resolve_tag_dir",
]

_OPTIM = re.compile(r"^(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt$")
_Z3_MODEL = re.compile(r"^zero_pp_rank_(\d+)_mp_rank_(\d+)_model_states\.pt$")
_MODEL = re.compile(r"^mp_rank_(\d+)_model_states\.pt$")


class CheckpointInfo(BaseModel):
    """One DeepSpeed checkpoint tag, as saved."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    path: Path = Field(description="the tag directory (<save_dir>/<tag>)")
    tag: str = Field(description="the tag name")
    zero_stage: int = Field(ge=0, le=3, description="ZeRO stage it was saved under")
    dp_world_size: int = Field(ge=1, description="data-parallel size it was saved under")
    mp_world_size: int = Field(1, ge=1, description="model-parallel (tensor) size")
    global_steps: int = Field(ge=0, description="optimizer steps taken when saved")
    global_samples: int = Field(ge=0, description="samples consumed when saved")
    ds_version: str = Field("", description="DeepSpeed version that wrote it")
    bf16: bool = Field(False, description="optimizer files carry the bf16_ prefix")
    universal: bool = Field(False, description="a universal checkpoint (has zero/<param>/ dirs)")
    complete: bool = Field(description="every rank's files are present")
    missing: tuple[str, ...] = Field((), description="files a complete checkpoint would have")
    ds_config: dict[str, Any] = Field(default_factory=dict, description="config saved with it")


UNREADABLE = (  # what reading a truncated or foreign checkpoint file raises
    zipfile.BadZipFile,
    pickle.UnpicklingError,
    EOFError,
    StopIteration,
    KeyError,
    OSError,
)


class _Stub:
    """Stands in for any class the pickle names; keeps constructor arguments for inspection."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args

    def __setstate__(self, state: Any) -> None:
        self.state = state


def _stub_class(module: str, name: str) -> type:
    if name.endswith("StageEnum"):  # deepspeed ZeroStageEnum(IntEnum): keep the number
        return type(name, (int,), {"__module__": module})
    return type(name, (_Stub,), {"__module__": module})


class _InertUnpickler(pickle.Unpickler):
    _ALLOWED: dict[tuple[str, str], Any] = {  # noqa: RUF012 (a lookup table, never mutated)
        ("collections", "OrderedDict"): collections.OrderedDict,
        ("copyreg", "_reconstructor"): copyreg._reconstructor,  # type: ignore[attr-defined]
        ("builtins", "object"): object,
        ("builtins", "set"): set,
        ("builtins", "frozenset"): frozenset,
        ("torch", "Size"): tuple,
    }

    def find_class(self, module: str, name: str) -> Any:
        return self._ALLOWED.get((module, name)) or _stub_class(module, name)

    def persistent_load(self, pid: Any) -> None:
        return None


def read_pickled_tree(path: Path) -> Any:
    """The object tree of a torch ``.pt`` zip file, tensors replaced by stubs."""
    with zipfile.ZipFile(path) as zf:
        name = next(n for n in zf.namelist() if n.endswith("/data.pkl") or n == "data.pkl")
        data = zf.read(name)
    return _InertUnpickler(io.BytesIO(data)).load()


def resolve_tag_dir(path: Path) -> Path | None:
    """``<save_dir>`` (via its ``latest`` file) or ``<save_dir>/<tag>`` → the tag directory."""
    if any(path.glob("*_model_states.pt")):
        return path
    for name in ("latest", "latest_universal"):
        marker = path / name
        if marker.is_file():
            tag_dir = path / marker.read_text().strip()
            return tag_dir if tag_dir.is_dir() else None
    return None


def _stage_from_optim(optim_file: Path) -> tuple[int, str]:
    tree = read_pickled_tree(optim_file)
    osd = tree.get("optimizer_state_dict", {}) if isinstance(tree, dict) else {}
    stage = int(osd.get("zero_stage", 1)) if isinstance(osd, dict) else 1
    return stage, str(tree.get("ds_version", "")) if isinstance(tree, dict) else ""


def read_checkpoint(path: Path) -> CheckpointInfo | None:
    """Inspect a save dir or tag dir; ``None`` when it holds no DeepSpeed checkpoint."""
    tag_dir = resolve_tag_dir(path)
    if tag_dir is None:
        return None
    names = sorted(p.name for p in tag_dir.iterdir())
    optim = [n for n in names if _OPTIM.match(n)]
    z3_models = [n for n in names if _Z3_MODEL.match(n)]
    models = [n for n in names if _MODEL.match(n)]
    model_file = tag_dir / (models[0] if models else (z3_models[0] if z3_models else ""))
    if not model_file.is_file():
        return None
    try:
        tree = read_pickled_tree(model_file)
    except UNREADABLE:
        return None
    dp = int(tree.get("dp_world_size", 1))
    mp = int(tree.get("mp_world_size", 1))
    unreadable: list[str] = []
    try:
        stage, version = _stage_from_optim(tag_dir / optim[0]) if optim else (0, "")
    except UNREADABLE:
        stage, version = (3 if z3_models else 1), ""
        unreadable.append(f"{optim[0]} (unreadable)")
    if z3_models and not models:
        stage = 3
    universal = (tag_dir / "zero").is_dir()
    missing = [] if universal else _missing_files(stage, dp, mp, names, optim)
    missing += unreadable
    return CheckpointInfo(
        path=tag_dir,
        tag=tag_dir.name,
        zero_stage=stage,
        dp_world_size=dp,
        mp_world_size=mp,
        global_steps=int(tree.get("global_steps", 0)),
        global_samples=int(tree.get("global_samples", 0) or 0),
        ds_version=str(tree.get("ds_version", version)),
        bf16=any(n.startswith("bf16_") for n in optim),
        universal=universal,
        complete=not missing,
        missing=tuple(missing),
        ds_config=dict(tree.get("ds_config") or {}),
    )


def _missing_files(stage: int, dp: int, mp: int, names: list[str], optim: list[str]) -> list[str]:
    have = set(names)
    prefix = "bf16_" if any(n.startswith("bf16_") for n in optim) else ""
    want: list[str] = []
    for m in range(mp):
        if stage == 3:
            want += [f"zero_pp_rank_{d}_mp_rank_{m:02d}_model_states.pt" for d in range(dp)]
        else:
            want.append(f"mp_rank_{m:02d}_model_states.pt")
        if stage >= 1:
            want += [f"{prefix}zero_pp_rank_{d}_mp_rank_{m:02d}_optim_states.pt" for d in range(dp)]
    return [w for w in want if w not in have]


def find_latest_complete(save_dir: Path) -> CheckpointInfo | None:
    """The tag ``latest`` names when it is complete, else the complete tag with the most
    steps: a job that died while saving leaves ``latest`` at a partial tag (or, with DeepSpeed
    writing ``latest`` last, a newer partial tag next to it)."""
    info = read_checkpoint(save_dir)
    if info is not None and info.complete:
        return info
    tags = [p for p in save_dir.iterdir() if p.is_dir() and any(p.glob("*_model_states.pt"))]
    found = [i for p in tags if (i := read_checkpoint(p)) is not None and i.complete]
    return max(found, key=lambda i: (i.global_steps, i.tag), default=None)
