"""DeepSpeed remedies for ``dssup run``: raise the ZeRO stage, offload, recompute, and resume.

Why a subpackage: DeepSpeed jobs carry their memory settings in a JSON, and DeepSpeed cannot
resume a ZeRO checkpoint under a different stage or data-parallel size. This package reads and
rewrites that JSON (``config``, ``render``), knows what a checkpoint was saved with
(``ckpt_info``, without torch), decides and performs the conversion the next attempt needs
(``compat``, ``convert``, ``ucp_worker`` as a child process), adds the DeepSpeed rung of the
remedy ladder (``ladder``), checks that the loss continues after a resume (``continuity``), and
plugs all of it into the generic supervisor as a ``PlanAdapter`` (``adapter``). DeepSpeed and
torch are needed only in the conversion child; everything here imports without them.
"""

from dssup.supervisor.deepspeed.adapter import DeepSpeedAdapter, to_ds_plan
from dssup.supervisor.deepspeed.assess import assess_attempt, attempt_losses
from dssup.supervisor.deepspeed.ckpt_info import (
    CheckpointInfo,
    find_latest_complete,
    read_checkpoint,
)
from dssup.supervisor.deepspeed.compat import LoadPath, decide_load
from dssup.supervisor.deepspeed.config import (
    DeepSpeedPlan,
    derive_plan,
    find_config,
    load_config_value,
)
from dssup.supervisor.deepspeed.continuity import (
    ContinuityRecord,
    LossPoint,
    check_continuity,
    parse_loss_lines,
)
from dssup.supervisor.deepspeed.convert import Resume, prepare_resume
from dssup.supervisor.deepspeed.ladder import DeepSpeedStep, MemoryContext, options_for
from dssup.supervisor.deepspeed.render import ConfigChange, render_config, write_json_atomic

__all__ = [
    "CheckpointInfo",
    "ConfigChange",
    "ContinuityRecord",
    "DeepSpeedAdapter",
    "DeepSpeedPlan",
    "DeepSpeedStep",
    "LoadPath",
    "LossPoint",
    "MemoryContext",
    "Resume",
    "adapter",
    "assess_attempt",
    "attempt_losses",
    "check_continuity",
    "decide_load",
    "derive_plan",
    "find_config",
    "find_latest_complete",
    "load_config_value",
    "options_for",
    "parse_loss_lines",
    "prepare_resume",
    "read_checkpoint",
    "render_config",
    "to_ds_plan",
    "write_json_atomic",
]


def adapter(memory: MemoryContext | None = None) -> DeepSpeedAdapter:
    """The factory ``dssup.supervisor.adapters.load_adapters`` looks for."""
    return DeepSpeedAdapter(memory=memory)
