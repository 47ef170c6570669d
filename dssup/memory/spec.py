"""What a model *is*, as far as memory is concerned: sizes, attention kind, experts, layout of
the block (MLP kind, norms, biases, tied head, sliding window).

One shape for every family (DeepSeek MLA+MoE, Llama/Mistral/Qwen dense with GQA, Mixtral and
Qwen MoE, gpt-oss, GELU 2-matrix MLPs of GPT-2/Phi/Falcon/GPT-NeoX/StarCoder2, Gemma's
sandwich norms), so the estimator and the planner never branch on a model's name: every
architectural difference that changes bytes is an explicit field. Reading Hugging Face
``config.json`` files into these fields lives in ``hf.py`` and ``families.py``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from dssup.errors import ConfigError

__all__ = ["MLASpec", "MoESpec", "ModelSpec"]

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class MLASpec(BaseModel):
    """Multi-head latent attention (DeepSeek-V2/V3) dimensions."""

    model_config = _FROZEN
    q_lora_rank: int = Field(ge=0, description="d_cq, query compression rank; 0 = no compression")
    kv_lora_rank: int = Field(gt=0, description="d_c, key/value compression rank")
    qk_nope_head_dim: int = Field(gt=0, description="d_h, per-head query/key dim without RoPE")
    qk_rope_head_dim: int = Field(ge=0, description="d_hr, decoupled RoPE dim")
    v_head_dim: int = Field(gt=0, description="per-head value dim")


class MoESpec(BaseModel):
    """Mixture-of-experts feed-forward layers."""

    model_config = _FROZEN
    n_routed: int = Field(gt=0, description="N, routed experts per MoE layer")
    n_shared: int = Field(ge=0, description="N_s, shared experts per MoE layer")
    top_k: int = Field(gt=0, description="N_r, routed experts activated per token")
    expert_ffn: int = Field(gt=0, description="h_E, intermediate size of one routed expert")
    shared_ffn: int = Field(ge=0, description="intermediate size of one shared expert")
    shared_gate: bool = Field(
        False, description="a [1, h] sigmoid gate on the shared expert (Qwen2-MoE)"
    )
    router_bias: bool = Field(
        False,
        description="a routing bias of N per layer (DeepSeek-V3 e_score_correction_bias, gpt-oss)",
    )
    expert_bias: bool = Field(
        False, description="biases on every expert's projections (gpt-oss): 2*h_E + h per expert"
    )
    first_dense: int = Field(0, ge=0, description="the first k layers use a dense MLP")
    every: int = Field(1, ge=1, description="every k-th layer (after first_dense) is MoE")
    dense_layers: tuple[int, ...] = Field((), description="extra layer indices with a dense MLP")

    @model_validator(mode="after")
    def _check(self) -> MoESpec:
        if self.top_k > self.n_routed:
            raise ConfigError(
                "moe.top_k",
                f"{self.top_k} exceeds n_routed={self.n_routed}",
                "use top_k <= n_routed",
            )
        return self


class ModelSpec(BaseModel):
    """A decoder-only transformer, described by the sizes that decide its memory."""

    model_config = _FROZEN
    name: str = Field("custom", description="label shown in reports")
    hidden: int = Field(gt=0, description="h, hidden size")
    ffn: int = Field(gt=0, description="h_F, intermediate size of a dense (SwiGLU) MLP")
    layers: int = Field(gt=0, description="number of transformer layers")
    heads: int = Field(gt=0, description="n_h, attention heads")
    kv_heads: int = Field(gt=0, description="key/value heads (GQA); equal to heads for MHA and MLA")
    head_dim: int = Field(gt=0, description="per-head dim of a standard attention layer")
    vocab: int = Field(gt=0, description="v, vocabulary size")
    tie_embeddings: bool = Field(False, description="head shares the embedding matrix")
    attention: Literal["mla", "gqa"] = Field("gqa", description="attention kind")
    qkv_bias: bool = Field(False, description="biases on q, k, v projections (Qwen2)")
    mla: MLASpec | None = Field(None, description="MLA dimensions when attention == 'mla'")
    moe: MoESpec | None = Field(None, description="expert layers; None for a dense model")
    mtp_depth: int = Field(0, ge=0, description="multi-token-prediction modules (DeepSeek-V3: 1)")
    mlp_kind: Literal["gated", "plain"] = Field(
        "gated",
        description="gated: 3 matrices (SwiGLU/GeGLU gate, up, down); plain: 2 (fc1, fc2)",
    )
    activation: str = Field("silu", description="MLP activation as the config names it")
    mlp_bias: bool = Field(
        False, description="biases on the MLP projections (h_F + h, gated 2h_F + h)"
    )
    attn_out_bias: bool = Field(False, description="bias on the attention output projection (h)")
    norm_kind: Literal["rms", "layer"] = Field("rms", description="RMSNorm or LayerNorm")
    norm_bias: bool = Field(False, description="norms carry a bias as well as a weight")
    layer_norms: int = Field(
        2, ge=1, description="hidden-size norms per layer (1 parallel block, 2, 4 Gemma-2/3)"
    )
    parallel_block: bool = Field(
        False, description="attention and MLP read the same normed input (Phi, Falcon, GPT-NeoX)"
    )
    qk_norm: Literal["none", "head", "full"] = Field(
        "none",
        description="norms on queries and keys: per head_dim (Qwen3, Gemma-3) or full width (OLMo-2)",
    )
    sliding_window: int | None = Field(
        None, ge=1, description="tokens a sliding-window attention layer attends to"
    )
    sliding_layers: int = Field(0, ge=0, description="layers that use the sliding window")
    attn_sinks: bool = Field(False, description="a learned sink logit per head (gpt-oss)")
    learned_positions: int = Field(
        0, ge=0, description="rows of a learned absolute position embedding (GPT-2: n_positions)"
    )
    head_bias: bool = Field(False, description="the output head has a bias of v (Phi)")
    notes: tuple[str, ...] = Field(
        (), description="assumptions made while reading the config, printed with every estimate"
    )

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        if self.attention == "mla" and self.mla is None:
            raise ConfigError(
                "mla",
                "attention is 'mla' but no MLA dimensions were given",
                "set kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim",
            )
        if self.heads % self.kv_heads:
            raise ConfigError(
                "kv_heads",
                f"{self.kv_heads} does not divide heads={self.heads}",
                "use a divisor of the attention heads",
            )
        if self.sliding_layers > self.layers or (self.sliding_layers and not self.sliding_window):
            raise ConfigError(
                "sliding_layers",
                f"{self.sliding_layers} sliding layers for {self.layers} layers, window "
                f"{self.sliding_window}",
                "give a window and at most one sliding layer per layer",
            )
        if self.moe is not None and self.moe.first_dense > self.layers:
            raise ConfigError(
                "moe.first_dense",
                f"{self.moe.first_dense} exceeds layers={self.layers}",
                "use at most the number of layers",
            )
        return self

    def is_moe_layer(self, index: int) -> bool:
        """Whether layer ``index`` (0-based) has an MoE feed-forward instead of a dense MLP."""
        moe = self.moe
        if moe is None or index < moe.first_dense or index in moe.dense_layers:
            return False
        return (index - moe.first_dense + 1) % moe.every == 0 if moe.every > 1 else True

    @property
    def moe_layer_count(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.layers))
