"""Causal language modelling with the Hugging Face ``Trainer``, written like transformers'
``examples/pytorch/language-modeling/run_clm.py`` (5.x): ``HfArgumentParser`` over model, data and
``TrainingArguments`` dataclasses, a model built from ``--model_type`` and ``--config_overrides``
(random init, no Hub access), texts grouped into ``--block_size`` chunks, and
``trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)``.

It knows nothing about dssup. Two things differ from the stock script, both because this
machine has no Hub and no GPU:

* the data is local: ``--train_file`` (plain text) or, without it, ``--synthetic_samples``
  seeded random bytes; a byte-level tokenizer (vocabulary 256) replaces the Hub tokenizer;
* the memory cap of the CPU notes, so a too-large per-device batch fails in torch's own
  allocator as a GPU would run out of memory: the ranks in ``RUN_CLM_MEMORY_CAP_RANKS``
  (default all) cap their address space when optimizer step ``RUN_CLM_MEMORY_CAP_FROM_STEP``
  (default 0) begins, ``RUN_CLM_MEMORY_CAP_MIB`` above their size then; or, with
  ``RUN_CLM_MEMORY_CAP_AT=forward``, at what the step's first micro-batch holds when the
  model's output embeddings (``lm_head``) have produced its logits, plus 1 MiB, so the loss of
  that micro-batch fails on any machine and one half as big fits (``dssup.runtime.standin``);
  the budget found is kept in ``RUN_CLM_MEMORY_CAP_FILE`` (``{rank}`` replaced) for the
  attempts after, which cap at it when that step begins.

    torchrun --standalone --nproc-per-node 2 examples/hf/run_clm.py --model_type gpt2 \\
        --config_overrides n_layer=2,n_embd=32,n_head=2,vocab_size=256,n_positions=128 \\
        --block_size 128 --do_train --output_dir out --per_device_train_batch_size 16 \\
        --max_steps 8 --save_steps 2 --use_cpu --ddp_backend gloo --report_to none
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, field

import torch
import transformers
from transformers import (
    CONFIG_MAPPING,
    AutoModelForCausalLM,
    HfArgumentParser,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    default_data_collator,
    set_seed,
)

logger = logging.getLogger(__name__)


@dataclass
class ModelArguments:
    model_type: str = field(default="gpt2", metadata={"help": "Model type to train from scratch."})
    config_overrides: str | None = field(
        default=None, metadata={"help": "Override config defaults: n_embd=10,resid_pdrop=0.2,..."}
    )


@dataclass
class DataTrainingArguments:
    train_file: str | None = field(default=None, metadata={"help": "A plain-text training file."})
    synthetic_samples: int = field(
        default=512, metadata={"help": "Without --train_file: this many blocks of random bytes."}
    )
    block_size: int = field(default=128, metadata={"help": "Tokens per training sequence."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Truncate the data."})


def tokenize(text: bytes) -> list[int]:
    """Byte-level tokens: the local stand-in for a Hub tokenizer (vocabulary 256)."""
    return list(text)


def group_texts(ids: list[int], block_size: int) -> list[dict[str, torch.Tensor]]:
    """Concatenated ids cut into blocks of ``block_size``; the remainder is dropped (as run_clm)."""
    total = (len(ids) // block_size) * block_size
    blocks = [ids[i : i + block_size] for i in range(0, total, block_size)]
    return [{"input_ids": torch.tensor(b), "labels": torch.tensor(b)} for b in blocks]


def load_text(data_args: DataTrainingArguments, seed: int) -> bytes:
    if data_args.train_file is not None:
        with open(data_args.train_file, "rb") as fh:
            return fh.read()
    gen = torch.Generator().manual_seed(seed)
    size = data_args.synthetic_samples * data_args.block_size
    return bytes(torch.randint(0, 256, (size,), generator=gen).tolist())


class MemoryCap(TrainerCallback):
    """The CPU notes' cap (``RLIMIT_AS``), applied once from the configured optimizer step."""

    def __init__(self) -> None:
        self.budget_mib = int(os.environ.get("RUN_CLM_MEMORY_CAP_MIB", "0"))
        self.at = os.environ.get("RUN_CLM_MEMORY_CAP_AT", "")
        if self.at not in ("", "forward") or (self.at and self.budget_mib):
            raise SystemExit("RUN_CLM_MEMORY_CAP_AT is 'forward' and excludes _MIB")
        self.from_step = int(os.environ.get("RUN_CLM_MEMORY_CAP_FROM_STEP", "0"))
        ranks = os.environ.get("RUN_CLM_MEMORY_CAP_RANKS", "all")
        self.capped = ranks == "all" or os.environ.get("RANK", "0") in ranks.split(",")
        self.done, self.device = False, None

    def on_train_begin(self, args, state, control, model=None, **kwargs):  # type: ignore[no-untyped-def]
        if self.at and self.capped and model is not None:
            from dssup.runtime.standin import DeviceStandIn

            self.device = DeviceStandIn(os.environ.get("RUN_CLM_MEMORY_CAP_FILE"))
            self.device.watch(model, model.get_output_embeddings())

    def on_step_begin(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        if self.done or not self.capped or state.global_step < self.from_step:
            return
        self.done = True
        if self.budget_mib:
            from dssup.runtime import memory_cap

            memory_cap(self.budget_mib << 20)
        elif self.device is not None:
            self.device.begin()  # a budget kept by an earlier attempt, or found at the logits


def main() -> None:
    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, TrainingArguments))
    if len(sys.argv) == 2 and sys.argv[1].endswith(".json"):
        model_args, data_args, training_args = parser.parse_json_file(
            json_file=os.path.abspath(sys.argv[1])
        )
    else:
        model_args, data_args, training_args = parser.parse_args_into_dataclasses()

    logging.basicConfig(
        format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
        datefmt="%m/%d/%Y %H:%M:%S",
        handlers=[logging.StreamHandler(sys.stdout)],
    )
    if training_args.should_log:
        transformers.utils.logging.set_verbosity_info()
    log_level = training_args.get_process_log_level()
    logger.setLevel(log_level)
    transformers.utils.logging.set_verbosity(log_level)
    transformers.utils.logging.enable_default_handler()
    transformers.utils.logging.enable_explicit_format()
    logger.warning(
        f"Process rank: {training_args.local_process_index}, device: {training_args.device}, "
        f"n_gpu: {training_args.n_gpu}, distributed training: "
        f"{training_args.parallel_mode.value == 'distributed'}"
    )
    logger.info(f"Training/evaluation parameters {training_args}")

    set_seed(training_args.seed)

    config = CONFIG_MAPPING[model_args.model_type]()
    logger.warning("You are instantiating a new config instance from scratch.")
    if model_args.config_overrides is not None:
        logger.info(f"Overriding config: {model_args.config_overrides}")
        config.update_from_string(model_args.config_overrides)
        logger.info(f"New config: {config}")
    model = AutoModelForCausalLM.from_config(config)
    n_params = sum({p.data_ptr(): p.numel() for p in model.parameters()}.values())
    logger.info(f"Training new model from scratch - Total size={n_params / 2**20:.2f}M params")

    with training_args.main_process_first(desc="grouping texts together"):
        train_dataset = group_texts(tokenize(load_text(data_args, training_args.seed)),
                                    data_args.block_size)  # fmt: skip
    if data_args.max_train_samples is not None:
        train_dataset = train_dataset[: data_args.max_train_samples]

    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset if training_args.do_train else None,
        data_collator=default_data_collator,
        callbacks=[MemoryCap()],
    )

    if training_args.do_train:
        checkpoint = None
        if training_args.resume_from_checkpoint is not None:
            checkpoint = training_args.resume_from_checkpoint
        train_result = trainer.train(resume_from_checkpoint=checkpoint)
        trainer.save_model()
        metrics = train_result.metrics
        metrics["train_samples"] = len(train_dataset)
        trainer.log_metrics("train", metrics)
        trainer.save_metrics("train", metrics)
        trainer.save_state()


if __name__ == "__main__":
    main()
