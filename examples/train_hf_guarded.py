"""A Hugging Face ``Trainer`` script with in-process OOM recovery: ``guarded(Trainer)``.

A tiny random-init Llama (no Hub access) trained on synthetic token data with the stock
``Trainer``; the only dssup lines are the two imports, ``guarded(Trainer)`` instead of
``Trainer`` and the ``DssupCallback`` (the job-side report). When a rank runs out of memory in
a micro-batch, every rank redoes the accumulation window with the micro-batch split in two
(the global batch stays per-device batch x accumulation x world), no restart.

``--cap_at forward --cap_from_step S`` caps rank ``--cap_ranks``'s address space at what the
first micro-batch of step S holds when its logits exist, plus 1 MiB (``dssup.runtime.standin``:
the CPU stand-in for a full GPU, sized by the job itself on any machine), so that step S fails
for real in torch's allocator and a micro-batch half as big fits; ``--cap_mib N`` caps at N MiB
above what the rank holds when step S begins instead. Run it::

    MALLOC_ARENA_MAX=1 dssup run --global-batch-size 32 -- torchrun --standalone \\
        --nproc-per-node 2 examples/train_hf_guarded.py --output_dir out --use_cpu \\
        --ddp_backend gloo --per_device_train_batch_size 16 --max_steps 4 --cap_at forward \\
        --cap_from_step 2 --cap_ranks 1 --weights_out final.pt
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

import torch
from transformers import (
    HfArgumentParser,
    LlamaConfig,
    LlamaForCausalLM,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

from dssup.runtime import memory_cap
from dssup.runtime.hf import DssupCallback
from dssup.runtime.hf_guard import guarded
from dssup.runtime.standin import DeviceStandIn


@dataclass
class JobArgs:
    seq_len: int = field(default=256, metadata={"help": "tokens per sample"})
    samples: int = field(default=256, metadata={"help": "synthetic samples"})
    cap_mib: int = field(default=0, metadata={"help": "address-space budget; 0: no cap"})
    cap_at: str = field(default="", metadata={"help": "'forward': size the cap at the logits"})
    cap_from_step: int = field(default=0, metadata={"help": "step from which the cap holds"})
    cap_ranks: str = field(default="all", metadata={"help": "'all' or comma-separated ranks"})
    weights_out: str = field(default="", metadata={"help": "rank 0 saves the final weights"})
    no_guard: bool = field(default=False, metadata={"help": "the stock Trainer"})


class Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Sample i: random tokens seeded by i alone (labels: the inputs, shifted by the model)."""

    def __init__(self, n: int, seq: int) -> None:
        self.n, self.seq = n, seq

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, 256, (self.seq,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids.clone()}


class CapAt(TrainerCallback):
    def __init__(self, job: JobArgs) -> None:
        if job.cap_at not in ("", "forward") or (job.cap_at and job.cap_mib):
            raise SystemExit("--cap_at is 'forward' and excludes --cap_mib")
        self.job, self.device = job, DeviceStandIn()
        rank = os.environ.get("RANK", "0")
        self.mine = job.cap_ranks == "all" or rank in job.cap_ranks.split(",")

    def on_train_begin(self, args, state, control, model=None, **kwargs):  # type: ignore[no-untyped-def]
        if self.job.cap_at and self.mine and model is not None:
            self.device.watch(model, model.get_output_embeddings())

    def on_step_begin(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        if not self.mine or state.global_step != self.job.cap_from_step:
            return
        if self.job.cap_mib:
            memory_cap(self.job.cap_mib << 20)
        elif self.job.cap_at:
            self.device.begin()


def main() -> None:
    args, job = HfArgumentParser((TrainingArguments, JobArgs)).parse_args_into_dataclasses()
    torch.manual_seed(args.seed)
    config = LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=job.seq_len,
    )  # fmt: skip
    config._attn_implementation = "eager"  # memory that grows with the batch, predictably
    model = LlamaForCausalLM(config)
    trainer_cls = Trainer if job.no_guard else guarded(Trainer)
    trainer = trainer_cls(
        model=model, args=args, train_dataset=Tokens(job.samples, job.seq_len),
        callbacks=[DssupCallback(), CapAt(job)],
    )  # fmt: skip
    trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
    if job.weights_out and trainer.is_world_process_zero():
        torch.save(trainer.model.state_dict(), job.weights_out)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(1)
    sys.exit(main())
