"""``accelerate launch`` (also ``accelerate-launch`` and ``python -m accelerate.commands.launch``).

Parsed as accelerate 1.15 parses it (``accelerate/commands/launch.py``: ``allow_abbrev=False``,
so worker arguments are never taken for launcher abbreviations); a test compares this option
table with ``launch_command_parser()``. Settings come from the flags, else from the config file
accelerate itself reads (``--config_file``, else ``$HF_HOME/accelerate/default_config.yaml``
unless ``--cpu``), else from its defaults:

* ``--num_processes`` is the *total* over all machines, ``--num_machines`` the node count,
  ``--machine_rank`` this node's rank;
* multi-process launches (``--multi_gpu``, a config whose ``distributed_type`` is a multi-device
  one, ``--use_fsdp``/``--use_megatron_lm``/``--use_deepspeed``, or several processes on a GPU
  machine) run ``torch.distributed.run`` inside accelerate: dssup then adds ``--log_dir``,
  ``--tee 3`` and ``--max_restarts 0`` (accelerate passes them to torchrun), and per-rank logs
  and error files are torchrun's;
* otherwise accelerate runs one process (its "simple" launcher): world size 1, no per-rank logs
  (dssup reads the console). Multi-CPU through ``mpirun`` (``--mpirun_hostfile``) is refused.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from dssup.errors import ConfigError
from dssup.supervisor.launchers.base import (
    FIELD,
    LaunchCommand,
    OptionTable,
    RankLog,
    World,
    gpu_count,
    parse_int,
)
from dssup.supervisor.launchers.torchrun import torchrun_rank_logs

__all__ = ["ACCELERATE", "Accelerate", "config_file", "read_config"]

_VALUES = [
    "config_file",
    "mixed_precision",
    "num_processes",
    "num_machines",
    "num_cpu_threads_per_process",
    "dynamo_backend",
    "dynamo_mode",
    "gpu_ids",
    "machine_rank",
    "main_process_ip",
    "main_process_port",
    "tee",
    "log_dir",
    "role",
    "rdzv_backend",
    "rdzv_conf",
    "max_restarts",
    "monitor_interval",
    "vm",
    "env",
    "main_training_function",
    "deepspeed_config_file",
    "zero_stage",
    "offload_optimizer_device",
    "offload_param_device",
    "offload_optimizer_nvme_path",
    "offload_param_nvme_path",
    "gradient_accumulation_steps",
    "gradient_clipping",
    "zero3_init_flag",
    "zero3_save_16bit_model",
    "deepspeed_hostfile",
    "deepspeed_exclusion_filter",
    "deepspeed_inclusion_filter",
    "deepspeed_multinode_launcher",
    "deepspeed_moe_layer_cls_names",
    "fsdp_version",
    "fsdp_offload_params",
    "fsdp_min_num_params",
    "fsdp_sharding_strategy",
    "fsdp_reshard_after_forward",
    "fsdp_auto_wrap_policy",
    "fsdp_transformer_layer_cls_to_wrap",
    "fsdp_backward_prefetch",
    "fsdp_state_dict_type",
    "fsdp_forward_prefetch",
    "fsdp_use_orig_params",
    "fsdp_cpu_ram_efficient_loading",
    "fsdp_sync_module_states",
    "fsdp_activation_checkpointing",
    "fsdp_activation_checkpointing_offload",
    "megatron_lm_tp_degree",
    "megatron_lm_use_custom_fsdp",
    "megatron_lm_no_load_optim",
    "megatron_lm_eod_mask_loss",
    "megatron_lm_overlap_cpu_optimizer_d2h_h2d",
    "megatron_lm_no_save_optim",
    "megatron_lm_optimizer_cpu_offload",
    "megatron_lm_use_precision_aware_optimizer",
    "megatron_lm_decoder_last_pipeline_num_layers",
    "megatron_lm_pp_degree",
    "megatron_lm_num_micro_batches",
    "megatron_lm_sequence_parallelism",
    "megatron_lm_recompute_activations",
    "megatron_lm_use_distributed_optimizer",
    "megatron_lm_gradient_clipping",
    "megatron_lm_recompute_granularity",
    "megatron_lm_recompute_method",
    "megatron_lm_recompute_num_layers",
    "megatron_lm_attention_backend",
    "megatron_lm_expert_model_parallel_size",
    "megatron_lm_context_parallel_size",
    "megatron_lm_attention_dropout",
    "megatron_lm_hidden_dropout",
    "megatron_lm_attention_softmax_in_fp32",
    "megatron_lm_expert_tensor_parallel_size",
    "megatron_lm_calculate_per_token_loss",
    "megatron_lm_use_rotary_position_embeddings",
    "fp8_backend",
    "fp8_margin",
    "fp8_interval",
    "fp8_format",
    "fp8_amax_history_len",
    "fp8_amax_compute_algo",
    "fp8_override_linear_precision",
    "fp8_opt_level",
    "fp8_enable_fsdp_float8_all_gather",
    "fp8_pad_inner_dim",
    "aws_access_key_id",
    "aws_secret_access_key",
    "mpirun_hostfile",
    "parallelism_config_dp_replicate_size",
    "parallelism_config_dp_shard_size",
    "parallelism_config_tp_size",
    "parallelism_config_cp_size",
    "parallelism_config_cp_backend",
    "parallelism_config_cp_comm_strategy",
    "parallelism_config_sp_size",
    "parallelism_config_sp_backend",
    "parallelism_config_sp_seq_length",
    "parallelism_config_sp_seq_length_is_variable",
    "parallelism_config_sp_attn_implementation",
]
_FLAGS = [
    "help",
    "quiet",
    "cpu",
    "multi_gpu",
    "tpu",
    "enable_cpu_affinity",
    "dynamo_use_fullgraph",
    "dynamo_use_dynamic",
    "dynamo_use_regional_compilation",
    "use_deepspeed",
    "use_fsdp",
    "use_parallelism_config",
    "use_megatron_lm",
    "same_network",
    "module",
    "no_python",
    "tpu_cluster",
    "no_tpu_cluster",
    "tpu_use_sudo",
    "downcast_bf16",
    "fp8_use_autocast_during_eval",
    "debug",
]
_SHORT = {"help": "-h", "quiet": "-q", "tee": "-t", "module": "-m"}
_SINGLE = {"help", "quiet", "tee", "module", "role", "vm", "env", "cpu", "tpu", "debug"}

TABLE = OptionTable.argparse("accelerate launch", _VALUES, _FLAGS, _SINGLE, _SHORT, abbrev=False)
_MODULE = "accelerate.commands.launch"
# accelerate's DistributedType values that make it launch several processes through torchrun
_MULTI = {
    "MULTI_GPU", "MULTI_NPU", "MULTI_MLU", "MULTI_SDAA", "MULTI_MUSA", "MULTI_XPU", "MULTI_HPU",
    "MULTI_NEURON", "FSDP", "MEGATRON_LM", "DEEPSPEED",
}  # fmt: skip


def config_file(cmd: LaunchCommand) -> Path | None:
    """The config file accelerate reads for this command, or None (accelerate's own rule)."""
    explicit = cmd.options.get("config_file")
    if explicit:
        return Path(explicit)
    if "cpu" in cmd.options:
        return None
    home = cmd.env.get("HF_HOME") or os.path.join(
        cmd.env.get("XDG_CACHE_HOME", "~/.cache"), "huggingface"
    )
    default = Path(os.path.expanduser(home)) / "accelerate" / "default_config.yaml"
    return default if default.is_file() else None


def read_config(cmd: LaunchCommand) -> dict[str, Any]:
    path = config_file(cmd)
    if path is None:
        return {}
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(FIELD, f"accelerate config {path} cannot be read ({exc})",
                          "fix the file or pass --config_file") from exc  # fmt: skip
    return doc if isinstance(doc, dict) else {}


class Accelerate:
    name = "accelerate"
    table = TABLE
    echo_rank_logs = False

    def match(self, argv: list[str]) -> int | None:
        base = os.path.basename(argv[0])
        if base == "accelerate" and len(argv) > 1 and argv[1] == "launch":
            return 2
        if base == "accelerate-launch":
            return 1
        if base.startswith("python"):
            for i, tok in enumerate(argv[1:], start=1):
                if tok == "-m" and i + 1 < len(argv) and argv[i + 1] == _MODULE:
                    return i + 2
        return None

    def env_option(self, cmd: LaunchCommand, name: str) -> str | None:
        value = read_config(cmd).get(name)
        return None if value is None else str(value)

    def through_torchrun(self, cmd: LaunchCommand) -> bool:
        """Whether accelerate starts the processes through ``torch.distributed.run``."""
        if "mpirun_hostfile" in cmd.options:
            raise ConfigError(FIELD, "accelerate's mpirun launch (--mpirun_hostfile) is not "
                              "supported", "launch with --multi_gpu (torchrun) instead")  # fmt: skip
        if "cpu" in cmd.options:
            return False
        if cmd.options.keys() & {"multi_gpu", "use_fsdp", "use_megatron_lm", "use_deepspeed"}:
            return True
        config = read_config(cmd)
        if str(config.get("distributed_type", "")).upper() in _MULTI:
            return True
        processes = parse_int(cmd.options.get("num_processes"), "--num_processes", "")
        return bool(processes and processes > 1 and gpu_count() > 1)

    def world(self, cmd: LaunchCommand) -> World:
        if not self.through_torchrun(cmd):
            return World(1, 1, 0, "accelerate's single-process launcher (no --multi_gpu)")
        fix = "give a whole number"
        total = parse_int(cmd.option("num_processes"), "--num_processes", fix)
        machines = parse_int(cmd.option("num_machines"), "--num_machines", fix) or 1
        rank = parse_int(cmd.option("machine_rank"), "--machine_rank", fix) or 0
        source = "--num_processes/--num_machines" if "num_processes" in cmd.options else ""
        if total is None:
            total, source = gpu_count(), "the GPUs seen (accelerate's default)"
        if not total or total % machines:
            raise ConfigError(
                FIELD,
                f"accelerate would start {total} processes on {machines} machine(s)",
                "pass --num_processes N (the total over all machines) with --multi_gpu",
            )
        where = config_file(cmd)
        source = source or (f"accelerate config {where}" if where else "accelerate's defaults")
        return World(machines, total // machines, rank, source)

    def extras(self, cmd: LaunchCommand, attempt_dir: Path) -> list[str]:
        if not self.through_torchrun(cmd):
            return []
        extra: list[str] = []
        if not cmd.has("log_dir"):
            extra += ["--log_dir", str(attempt_dir / "logs")]
        if not cmd.has("tee"):
            extra += ["--tee", "3"]
        if not cmd.has("max_restarts"):
            extra += ["--max_restarts", "0"]
        return extra

    def log_dir(self, cmd: LaunchCommand, attempt_dir: Path) -> Path | None:
        if not self.through_torchrun(cmd):
            return None
        user = cmd.option("log_dir")
        return Path(user) if user else attempt_dir / "logs"

    def rank_logs(self, log_dir: Path) -> dict[int, RankLog]:
        return torchrun_rank_logs(log_dir)


ACCELERATE = Accelerate()
