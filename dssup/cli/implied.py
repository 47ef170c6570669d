"""Flags that only take effect with another one: imply the other and say so, refuse a conflict.

Why: ``--recompute-modules`` means nothing without ``--recompute selective``, ``--offload
params`` nothing without ZeRO-3. Refusing such a command line makes the user type what the
first flag already said; silently ignoring the first flag is worse. So the missing flag is
implied and printed among the assumptions, and only a flag that contradicts it (``--recompute
full --recompute-modules ...``) is refused, in one line naming both and the fix.
"""

from __future__ import annotations

from typing import Any, Literal

from dssup.errors import ConfigError

__all__ = ["imply"]

Command = Literal["estimate", "plan"]


def imply(o: dict[str, Any], given: set[str], command: Command) -> list[str]:
    """Fill in what the given flags need (``o`` is changed in place); one line per implied flag.
    ``plan`` searches recompute, ZeRO and the layout itself, so there only what pins nothing is
    implied (the compute dtype of FP8 caching and the other way round)."""
    notes: list[str] = []
    if command == "estimate":
        notes += _recompute(o, given)
        notes += _offload(o, given)
    else:
        _recompute_conflict(o, given)
        _offload_conflict(o, given)
        if o.get("recompute_modules") and "recompute" not in given:
            notes.append(
                "--recompute-modules: what the selective rows recompute (recompute is "
                "searched; --recompute selective pins it)"
            )
    notes += _split_pp(o, given)
    notes += _fp8(o, given, command)
    if o.get("vpp", 1) > 1 and "schedule" not in given:
        notes.append(f"--schedule interleaved, implied by --vpp {o['vpp']}")
    return notes


def _recompute(o: dict[str, Any], given: set[str]) -> list[str]:
    _recompute_conflict(o, given)
    if "recompute" in given:
        return []
    if o.get("recompute_modules"):
        o["recompute"] = "selective"
        return ["--recompute selective, implied by --recompute-modules (only selective reads it)"]
    full = [f for f in ("recompute_method", "recompute_num_layers") if o.get(f) is not None]
    if full:
        o["recompute"] = "full"
        flag = "--" + full[0].replace("_", "-")
        return [f"--recompute full, implied by {flag} (only full recompute reads it)"]
    return []


def _recompute_conflict(o: dict[str, Any], given: set[str]) -> None:
    if "recompute" not in given:
        return
    level = o["recompute"]
    if o.get("recompute_modules") and level != "selective":
        raise ConfigError(
            "--recompute-modules",
            f"only selective recompute reads it, and --recompute {level} was given",
            "drop --recompute-modules or use --recompute selective",
        )
    for name in ("recompute_method", "recompute_num_layers"):
        if o.get(name) is not None and level != "full":
            flag = "--" + name.replace("_", "-")
            raise ConfigError(
                flag,
                f"only full recompute reads it, and --recompute {level} was given",
                f"drop {flag} or use --recompute full",
            )


def _offload(o: dict[str, Any], given: set[str]) -> list[str]:
    _offload_conflict(o, given)
    if o.get("offload") in ("params", "both") and "zero" not in given:
        o["zero"] = 3
        return [f"--zero 3, implied by --offload {o['offload']} (parameters offload under ZeRO-3)"]
    return []


def _offload_conflict(o: dict[str, Any], given: set[str]) -> None:
    if o.get("offload") in ("params", "both") and "zero" in given and o["zero"] != 3:
        raise ConfigError(
            "--offload",
            f"{o['offload']} offloads parameters, which needs ZeRO-3, and --zero {o['zero']} "
            "was given",
            "use --zero 3, or --offload optimizer",
        )


def _split_pp(o: dict[str, Any], given: set[str]) -> list[str]:
    """``--layers-per-stage`` names its stages: PP is their count (over ``--vpp`` chunks)."""
    split = o.get("layers_per_stage")
    if not split or "pp" in given:
        return []
    entries = len(split.split(","))
    if entries % o["vpp"]:
        raise ConfigError(
            "--layers-per-stage",
            f"{entries} entries do not make whole stages of --vpp {o['vpp']} chunks",
            "give one layer count per model chunk: PP x VPP entries",
        )
    o["pp"] = entries // o["vpp"]
    return [f"--pp {o['pp']}, implied by the {entries} entries of --layers-per-stage"]


def _fp8(o: dict[str, Any], given: set[str], command: Command) -> list[str]:
    """FP8 caching and FP8 GEMMs go together (TransformerEngine caches the FP8 cast it
    computes with; DeepSeek-V3 does both): given one, the plan's cost model takes the other."""
    if command != "plan":
        return []
    cached = o.get("precision") == "fp8" or "activations=fp8" in (o.get("dtypes") or "")
    if cached and "compute_dtype" not in given:
        o["compute_dtype"] = "fp8"
        return ["--compute-dtype fp8, implied by FP8 caching (--precision fp8 / activations=fp8)"]
    stated = o.get("precision") is not None or "activations=" in (o.get("dtypes") or "")
    eager = o.get("framework") in ("deepspeed", "transformers") or o.get("convention") == "paper"
    if o.get("compute_dtype") == "fp8" and not stated and not eager:
        o["dtypes"] = ",".join(x for x in (o.get("dtypes"), "activations=fp8") if x)
        return [
            "FP8 caching of linear-layer inputs (activations=fp8), implied by --compute-dtype fp8"
        ]
    return []
