"""Where each training knob may be written: flags, environment variables, DeepSpeed keys.

One table, read by the config resolver and by the patch writer, so that reading and rewriting a
knob can never disagree about its spelling.
"""

from __future__ import annotations

__all__ = [
    "DS_CONFIG",
    "ENV",
    "HF",
    "LAUNCHER",
    "MEGATRON",
    "MEGATRON_MODEL",
    "MEGATRON_TOKENIZER",
    "MODEL_FLAGS",
    "PEFT_ENV",
    "PEFT_FLAGS",
    "SWITCHES",
    "TORCHTUNE_CONFIG",
    "all_names",
]


def _f(*names: str) -> frozenset[str]:
    return frozenset(names)


MEGATRON: dict[str, frozenset[str]] = {
    "tp": _f("--tensor-model-parallel-size"),
    "pp": _f("--pipeline-model-parallel-size"),
    "ep": _f("--expert-model-parallel-size"),
    "etp": _f("--expert-tensor-parallel-size"),
    "cp": _f("--context-parallel-size"),
    "vpp": _f("--virtual-pipeline-model-parallel-size"),
    "layers_per_vstage": _f("--num-layers-per-virtual-pipeline-stage"),
    "micro_batch": _f("--micro-batch-size"),
    "global_batch": _f("--global-batch-size"),
    "seq_len": _f("--seq-length"),
    "recompute": _f("--recompute-granularity"),
    "recompute_method": _f("--recompute-method"),
    "recompute_layers": _f("--recompute-num-layers"),
}
SWITCHES: dict[str, frozenset[str]] = {
    "sp": _f("--sequence-parallel"),
    "dist_opt": _f("--use-distributed-optimizer"),
    "recompute_activations": _f("--recompute-activations"),
    "bf16": _f("--bf16"),
    "fp16": _f("--fp16"),
    "untie": _f("--untie-embeddings-and-output-weights"),
    "gqa": _f("--group-query-attention"),
    "mla": _f("--multi-latent-attention"),
}
MEGATRON_MODEL: dict[str, frozenset[str]] = {
    "num_hidden_layers": _f("--num-layers"),
    "hidden_size": _f("--hidden-size"),
    "intermediate_size": _f("--ffn-hidden-size"),
    "num_attention_heads": _f("--num-attention-heads"),
    "num_key_value_heads": _f("--num-query-groups"),
    "head_dim": _f("--kv-channels"),
    "vocab_size": _f("--vocab-size"),
    "n_routed_experts": _f("--num-experts"),
    "num_experts_per_tok": _f("--moe-router-topk"),
    "moe_intermediate_size": _f("--moe-ffn-hidden-size"),
    "shared_size": _f("--moe-shared-expert-intermediate-size"),
    "moe_layer_freq": _f("--moe-layer-freq"),
    "q_lora_rank": _f("--q-lora-rank"),
    "kv_lora_rank": _f("--kv-lora-rank"),
    "qk_nope_head_dim": _f("--qk-head-dim"),
    "qk_rope_head_dim": _f("--qk-pos-emb-head-dim"),
    "v_head_dim": _f("--v-head-dim"),
    "num_nextn_predict_layers": _f("--mtp-num-layers"),
}
HF: dict[str, frozenset[str]] = {
    "micro_batch": _f("--per_device_train_batch_size", "--per-device-train-batch-size"),
    "grad_accum": _f("--gradient_accumulation_steps", "--gradient-accumulation-steps"),
    "recompute": _f("--gradient_checkpointing", "--gradient-checkpointing"),
    "seq_len": _f("--max_seq_length", "--max-seq-length", "--model_max_length", "--block_size"),
    "model": _f("--model_name_or_path", "--model-name-or-path"),
    "deepspeed": _f("--deepspeed", "--deepspeed_config", "--deepspeed-config"),
    "fsdp": _f("--fsdp", "--fsdp_config", "--fsdp-config"),
}
MEGATRON_TOKENIZER: dict[str, frozenset[str]] = {
    "type": _f("--tokenizer-type"),
    "model": _f("--tokenizer-model"),
}
MODEL_FLAGS = frozenset(
    {
        "--model_name_or_path",
        "--model-name-or-path",
        "--pretrained_model_name_or_path",
        "--model",
        "--model_id",
        "--model-id",
        "--model_name",
        "--model-name",
        "--base_model",
        "--hf_model",
    }
)
TORCHTUNE_CONFIG = frozenset({"--config"})
# Parameter-efficient fine-tuning (LoRA, QLoRA, PEFT): not modelled by dssup's memory model.
PEFT_FLAGS = frozenset(
    {
        "--lora_r",
        "--lora-r",
        "--lora_rank",
        "--lora-rank",
        "--use_peft",
        "--use-peft",
        "--peft",
        "--lora",
        "--use_lora",
        "--use-lora",
        "--finetuning_type",
        "--finetuning-type",
    }
)
PEFT_ENV = ("LORA_R", "LORA_RANK", "USE_LORA", "USE_PEFT", "PEFT_METHOD")
LAUNCHER: dict[str, frozenset[str]] = {
    "nnodes": _f("--nnodes"),  # torchrun: a fixed node count forbids adding replicas
}
ENV: dict[str, tuple[str, ...]] = {
    "micro_batch": ("DSSUP_MICRO_BATCH_SIZE", "MICRO_BATCH_SIZE"),
    "global_batch": ("DSSUP_GLOBAL_BATCH_SIZE", "GLOBAL_BATCH_SIZE"),
    "grad_accum": ("DSSUP_GRAD_ACCUM_STEPS",),
    "recompute": ("DSSUP_RECOMPUTE",),
    "zero_stage": ("DSSUP_ZERO_STAGE",),
    "seq_len": ("DSSUP_SEQ_LENGTH", "SEQ_LENGTH"),
}
DS_CONFIG: dict[str, str] = {
    "micro_batch": "train_micro_batch_size_per_gpu",
    "grad_accum": "gradient_accumulation_steps",
    "global_batch": "train_batch_size",
}


def all_names() -> frozenset[str]:
    """Every flag dssup reads (used to tell a training launcher from anything else)."""
    names: set[str] = set(MODEL_FLAGS | TORCHTUNE_CONFIG | PEFT_FLAGS)
    for table in (MEGATRON, SWITCHES, MEGATRON_MODEL, MEGATRON_TOKENIZER, HF, LAUNCHER):
        for flags in table.values():
            names |= flags
    return frozenset(names)
