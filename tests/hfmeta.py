"""Parameter counts of the models transformers builds from a config, on the meta device
(nothing allocated): the independent side of the memory model's parameter counts."""

from __future__ import annotations

import warnings
from typing import Any


def text_params(model: Any) -> int:
    """The language model and its head (a multimodal model's vision tower left out)."""
    inner = getattr(model, "model", None)
    lm = getattr(inner, "language_model", None)
    if lm is None:
        return sum(p.numel() for p in model.parameters())
    head = getattr(model, "lm_head", None)
    tied = head is not None and head.weight is lm.embed_tokens.weight
    extra = 0 if head is None or tied else sum(p.numel() for p in head.parameters())
    return sum(p.numel() for p in lm.parameters()) + extra


def meta_count(cfg: dict[str, Any]) -> int:
    """Parameters of the text model transformers builds from ``cfg`` (a config.json dict)."""
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    transformers.logging.set_verbosity_error()
    config = AutoConfig.for_model(**cfg)
    multimodal = "text_config" in cfg or "vision_config" in cfg
    auto = AutoModelForImageTextToText if multimodal else AutoModelForCausalLM
    with warnings.catch_warnings(), torch.device("meta"):
        warnings.simplefilter("ignore")
        model = auto.from_config(config)
    return text_params(model)
