"""Settings of one supervised run: every knob with its unit and the reason it exists."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from dssup.supervisor.models import TrainingPlan

__all__ = ["SupervisorConfig"]


class SupervisorConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    run_id: str = Field(description="names the run directory and every attempt's token")
    run_dir: Path = Field(description="journal, per-attempt logs, error files, plan files")
    command: list[str] = Field(description="the user's torchrun command, as given")
    initial_plan: TrainingPlan = Field(description="attempt 1's plan (global batch kept exact)")
    checkpoint_dir: Path | None = Field(None, description="where the job saves checkpoints")
    checkpoint_pattern: str | None = Field(None, description="glob under checkpoint_dir")
    device: Literal["cpu", "cuda"] = Field(
        "cuda", description="where tensors live; 'cpu' makes CPU-allocator failures device OOMs"
    )
    max_attempts: int = Field(8, ge=1, description="global budget of torchrun launches")
    max_no_progress: int = Field(
        5,
        ge=1,
        description="stop after this many failed attempts in a row that saved no newer "
        "checkpoint (progress = checkpoint step advanced)",
    )
    transient_retries: int = Field(3, ge=0, description="retries of unknown failures, in a row")
    backoff_initial_s: float = Field(1.0, ge=0, description="first transient backoff, seconds")
    backoff_max_s: float = Field(30.0, ge=0, description="longest transient backoff, seconds")
    grace_s: float = Field(10.0, ge=0, description="SIGTERM to SIGKILL for stragglers, seconds")
    gpu_release_timeout_s: float = Field(30.0, ge=0, description="wait for NVML to show free")
    metrics_textfile: Path | None = Field(None, description="Prometheus textfile to rewrite")
    fast_fail: bool = Field(
        True, description="stop an attempt as soon as a rank's error file names an OOM or a "
        "user error, instead of waiting for torchrun's teardown",
    )  # fmt: skip
    stream_output: bool = Field(True, description="copy torchrun's output to our stdout")
