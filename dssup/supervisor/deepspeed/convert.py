"""Turn "this checkpoint, that next config" into a directory the next attempt can load.

Converts at most once per (checkpoint, mode): results are cached under the run directory, keyed
by the tag directory's path and every file's size and modification time, and built in a
temporary directory that is renamed into place only after the child wrote its manifest. The
user's checkpoint is only ever read. When no conversion keeps the optimizer (a move down to
stage 0, or a failed conversion), the fallback is consolidated fp32 weights with a fresh
optimizer: logged as a warning and returned as a record the journal keeps.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from dssup.supervisor.deepspeed.ckpt_info import CheckpointInfo
from dssup.supervisor.deepspeed.compat import LoadPath, decide_load
from dssup.supervisor.deepspeed.ucp_worker import MANIFEST

__all__ = ["Resume", "Runner", "cache_key", "prepare_resume"]

log = logging.getLogger(__name__)
Runner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]


class Resume(BaseModel):
    """What the next attempt resumes from: a journal record."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["direct", "universal", "fp32-fallback", "none"] = Field(description="load path")
    reason: str = Field(description="why this path")
    source: Path | None = Field(None, description="the user's checkpoint tag directory (read only)")
    load_dir: Path | None = Field(None, description="directory to pass as DSSUP_RESUME_FROM")
    load_universal: bool = Field(
        False, description="set checkpoint.load_universal in the next JSON"
    )
    fp32_weights: Path | None = Field(None, description="consolidated weights (fallback only)")
    keeps_optimizer: bool = Field(False, description="Adam moments and step survive")
    cached: bool = Field(False, description="the conversion was already in the cache")
    seconds: float = Field(0.0, ge=0, description="conversion wall time (0 when cached or none)")
    global_steps: int = Field(0, ge=0, description="optimizer steps in the checkpoint")
    global_samples: int = Field(0, ge=0, description="samples consumed in the checkpoint")
    warning: str = Field("", description="loud message when the optimizer state is lost")


def cache_key(info: CheckpointInfo, mode: str) -> str:
    """Stable for an unchanged checkpoint; changes when any of its files changes."""
    h = hashlib.sha256(f"{mode}\0{info.path.resolve()}".encode())
    for path in sorted(info.path.iterdir()):
        if path.is_file():
            st = path.stat()
            h.update(f"\0{path.name}\0{st.st_size}\0{st.st_mtime_ns}".encode())
    return f"{info.tag}-{mode}-{h.hexdigest()[:16]}"


def _default_runner(cmd: Sequence[str]) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.setdefault("DS_ACCELERATOR", "cpu")
    return subprocess.run(list(cmd), capture_output=True, text=True, env=env, check=False)


def _convert(
    info: CheckpointInfo, mode: str, cache_root: Path, python: str, runner: Runner
) -> tuple[Path, bool, float]:
    final = cache_root / cache_key(info, mode)
    if (final / MANIFEST).is_file():
        return final, True, 0.0
    tmp = cache_root / f".tmp-{final.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    cmd = [python, "-m", "dssup.supervisor.deepspeed.ucp_worker", "--src", str(info.path)]
    cmd += ["--out", str(tmp), "--mode", mode, "--stage", str(info.zero_stage)]
    t0 = time.monotonic()
    done = runner(cmd)
    seconds = time.monotonic() - t0
    if done.returncode != 0 or not (tmp / MANIFEST).is_file():
        shutil.rmtree(tmp, ignore_errors=True)
        tail = (done.stderr or "").strip().splitlines()[-3:]
        raise RuntimeError(f"{mode} conversion of {info.path} failed: {' | '.join(tail)}")
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return final, False, seconds


def prepare_resume(
    info: CheckpointInfo | None,
    stage: int,
    dp: int,
    cache_root: Path,
    python: str = sys.executable,
    runner: Runner = _default_runner,
    force_universal: bool = False,
) -> Resume:
    """Decide the load path and, when needed, convert (once, cached). Never raises for a
    failed conversion: it falls back to fp32 weights, and if even that fails, to no resume.
    ``force_universal`` converts even where a direct load would work (tests, and users who
    distrust a native cross-stage load)."""
    path = decide_load(info, stage, dp)
    if force_universal and path.kind == "direct" and stage > 0:
        path = LoadPath(
            kind="universal",
            reason=f"{path.reason}; converting anyway (forced)",
            keeps_optimizer=True,
        )
    if info is None or path.kind == "none":
        return Resume(kind="none", reason=path.reason)
    base = _base(info, path)
    if path.kind == "direct":
        return Resume(**base, load_dir=info.path.parent)
    if path.kind == "universal" and info.universal:
        return Resume(**base, load_dir=info.path.parent, load_universal=True)
    if path.kind == "universal":
        try:
            out, cached, secs = _convert(info, "universal", cache_root, python, runner)
            return Resume(**base, load_dir=out, load_universal=True, cached=cached, seconds=secs)
        except RuntimeError as exc:
            log.warning("universal conversion failed, falling back to fp32 weights: %s", exc)
            reason = f"{path.reason}; conversion failed ({exc})"
            path = LoadPath(kind="fp32-fallback", reason=reason, keeps_optimizer=False)
            base = _base(info, path)
    return _fallback(info, base, cache_root, python, runner)


def _base(info: CheckpointInfo, path: LoadPath) -> dict[str, object]:
    return {
        "kind": path.kind,
        "reason": path.reason,
        "source": info.path,
        "keeps_optimizer": path.keeps_optimizer,
        "global_steps": info.global_steps,
        "global_samples": info.global_samples,
    }


def _fallback(
    info: CheckpointInfo, base: dict[str, object], cache_root: Path, python: str, runner: Runner
) -> Resume:
    warning = (
        f"OPTIMIZER STATE LOST: resuming {info.tag} (step {info.global_steps}) from fp32 "
        "weights with a fresh optimizer; Adam moments restart from zero and the loss may jump"
    )
    try:
        out, cached, secs = _convert(info, "fp32", cache_root, python, runner)
    except RuntimeError as exc:
        log.error("fp32 fallback failed too, the next attempt starts fresh: %s", exc)
        return Resume(kind="none", reason=f"{base['reason']}; fp32 export failed ({exc})")
    log.warning("%s", warning)
    weights = out / "pytorch_model_fp32.pt"
    return Resume(**base, fp32_weights=weights, cached=cached, seconds=secs, warning=warning)
