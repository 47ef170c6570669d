"""Whether the model files a training script wrote at its end are whole.

The Hugging Face Trainer prints "Training completed." before the script's own final
``save_model``/``save_state`` run. A worker that dies after that line (killed by its launcher
when a peer aborts, out of disk, over a file-size quota) leaves a model file cut short that
loads nowhere, yet "training completed" is true. So a failure after training counts as a
harmless teardown only when the script's final save is seen to be whole; anything less is said
to be unverified, never called a success.

Whole is read from each format's own framing, without loading a tensor (milliseconds for any
size): safetensors' header length and the largest data offset against the file size; a
sharded checkpoint's index against its shards; ``torch.save``'s zip central directory (a cut
zip has none); a shard with no index is a save stopped before its end (``save_pretrained``
writes the index last). Only files written at or after ``since`` (the attempt's start) count:
an older model in the same directory says nothing about this attempt. Writers that replace
the file atomically (safetensors 0.8 writes a temporary file and renames it) leave no model
file at all when stopped, which reads as "no model file written", never as whole.
"""

from __future__ import annotations

import json
import re
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["FinalSave", "final_save", "fresh"]

# model files save_pretrained / PEFT write at the top of the output directory
_STEMS = ("model", "pytorch_model", "adapter_model", "diffusion_pytorch_model")
_HEADER_LIMIT = 100 << 20  # safetensors' own bound on the header length
_SHARD = re.compile(r"-\d{5}-of-\d{5}\.(?:safetensors|bin)$")  # save_pretrained's shard names


def _safetensors(path: Path, size: int) -> str | None:
    """None when whole, else what is wrong (sizes named)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                return f"{path.name}: {size} bytes, shorter than its 8-byte header length"
            (length,) = struct.unpack("<Q", head)
            if length > _HEADER_LIMIT or 8 + length > size:
                return f"{path.name}: header of {length} bytes in a file of {size} bytes"
            header = json.loads(fh.read(length))
    except (OSError, ValueError) as exc:
        return f"{path.name}: unreadable header ({exc})"
    if not isinstance(header, dict):
        return f"{path.name}: header is not a table of tensors"
    ends = [
        int(v["data_offsets"][1])
        for k, v in header.items()
        if k != "__metadata__" and isinstance(v, dict) and len(v.get("data_offsets") or ()) == 2
    ]
    want = 8 + length + max(ends, default=0)
    if size != want:
        return f"{path.name}: {size} of the {want} bytes its header describes"
    return None


def _zip(path: Path, size: int) -> str | None:
    try:
        with zipfile.ZipFile(path) as zf:
            zf.infolist()
    except (OSError, zipfile.BadZipFile) as exc:
        return f"{path.name}: {size} bytes, not a whole torch.save archive ({exc})"
    return None


def _check(path: Path) -> str | None:
    try:
        size = path.stat().st_size
    except OSError as exc:
        return f"{path.name}: missing ({exc.strerror})"
    if path.name.endswith(".safetensors"):
        return _safetensors(path, size)
    return _zip(path, size)


def fresh(path: Path, since: float) -> bool:
    """``path`` exists and was written at or after ``since``."""
    try:
        return path.stat().st_mtime >= since
    except OSError:
        return False


def _is_model(path: Path) -> bool:
    name = path.name
    return name.endswith((".safetensors", ".bin")) and name.startswith(_STEMS)


@dataclass(frozen=True)
class FinalSave:
    """The verdict on one output directory: the whole files and what is wrong with the rest."""

    whole: tuple[str, ...] = ()
    broken: tuple[str, ...] = ()


def final_save(out: Path, since: float) -> FinalSave:
    """Model files in ``out`` (not its ``checkpoint-*``) written since ``since``: whole or not.

    A sharded save is judged by its index (``*.safetensors.index.json``,
    ``*.bin.index.json``): every shard it names must be there and whole."""
    whole: list[str] = []
    broken: list[str] = []
    if not out.is_dir():
        return FinalSave()
    indexed: set[str] = set()
    for index in sorted(out.glob("*.index.json")):
        if not fresh(index, since) or not index.name.startswith(_STEMS):
            continue
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            broken.append(f"{index.name}: unreadable index ({exc})")
            continue
        bad = [p for s in shards if (p := _check(out / s))]
        indexed.update(shards)
        if bad:
            broken.append(f"{index.name}: " + "; ".join(bad))
        else:
            whole.append(f"{index.name} ({len(shards)} whole shards)")
    for path in sorted(out.iterdir()):
        if path.name in indexed or not _is_model(path) or not fresh(path, since):
            continue
        if _SHARD.search(path.name):  # the index is written after the last shard
            broken.append(f"{path.name}: a shard with no index written by this attempt")
            continue
        problem = _check(path)
        if problem:
            broken.append(problem)
        else:
            whole.append(path.name)
    return FinalSave(tuple(whole), tuple(broken))
