"""The traced profile inside the pure memory model: the replay's arithmetic, exact.

A hand-made profile (numbers chosen so every term is visible) is replayed over a stage and the
peaks are compared with what the documented timeline gives by hand: W + O, then the batch, the
embedding window, each block's forward, the head and loss, each block's backward (first block
last), the embedding's backward; gradients scaled by the device's sharding or, when
accumulating, added into existing ones.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dssup.cli.options import load_profile
from dssup.errors import ConfigError
from dssup.memory import Layout, ModelSpec, Overheads, PlanRequest, Precision, Training, estimate
from dssup.memory import plan as plan_configs
from dssup.memory.params import model_total
from dssup.memory.traced import (
    BatchTerm,
    KindTrace,
    LevelTrace,
    Moment,
    Provenance,
    ReplayStage,
    SeqPoly,
    TracedProfile,
    Window,
    replay,
)

MODEL = ModelSpec(
    name="t", hidden=64, ffn=160, layers=3, heads=4, kv_heads=2, head_dim=16, vocab=512
)
FP32 = Precision(weights=4, gradients=4, master=0, moments=4, activations=4)
NONE = Overheads(comm_buffer_bytes=0, fragmentation=0.0, cuda_context_bytes=0)
LAYER = 2 * 64 + 64 * 64 * 2 + 2 * 64 * 32 + 3 * 64 * 160  # norms, q/o, k/v, SwiGLU
STAGE = model_total(MODEL, "megatron") - 3 * LAYER  # embedding, head, final norm


def term(per_token: float, const: float = 0.0, scores: float = 0.0) -> BatchTerm:
    return BatchTerm(
        per_sample=SeqPoly(c=(0.0, per_token, scores)), constant=SeqPoly(c=(const, 0.0, 0.0))
    )


def window(peak: BatchTerm, end: BatchTerm, grads: int = 0, at_peak: int = 0) -> Window:
    return Window(moments=[Moment(bytes=peak, grads=at_peak)], end=end, grads=grads)


G = 4 * LAYER  # one block's fp32 gradients
BLOCK = KindTrace(
    forward=window(term(1000), term(800)),
    backward=window(term(300, G), term(-800, G), grads=G, at_peak=G),
    parameters=LAYER,
)
LEVEL = LevelTrace(
    inputs=term(16),
    pre=window(term(600), term(512)),
    post=window(term(4000), term(3000)),
    head=window(term(3500, 4 * 64 * 512), term(-3000, 4 * 64 * 512), grads=4 * 64 * 512),
    embed=window(term(0, 9000), term(-512, 4 * 64 * 512), grads=4 * 64 * 512),
    first_forward=window(term(1000), term(800)),
    first_backward=window(term(300, G), term(-800, G), grads=G, at_peak=G),
    kinds={"dense": BLOCK},
)
PROFILE = TracedProfile(
    provenance=Provenance(
        source="hf",
        model="hand-made",
        versions={"torch": "x"},
        knobs={"dtype": "fp32"},
        micro_batches=(2, 3, 4),
        seq_lens=(16, 32, 64),
        check_seq_len=48,
        traces=21,
        seconds=1.0,
        created="now",
    ),
    dtype="fp32",
    optimizer="foreach",
    attention="sdpa",
    levels={"none": LEVEL},
    optimizer_transient_per_param=4.0,
    blocks={"dense": 3},
    first_dense=3,
    found="3 dense blocks in model.layers; no MTP module",
    stage_parameters=STAGE,
    worst_check=0.0,
)
S = 10  # tokens per sequence


def one_device(**kw: object) -> ReplayStage:
    args: dict[str, object] = {
        "order": (("dense", 3),), "first": True, "last": True, "s": S, "s_keys": S,
        "per_sample_divisor": 1, "grad_scale": 1.0, "accumulate": False, "in_flight": 1,
        "imbalance": 1.0,
    }  # fmt: skip
    return ReplayStage(**(args | kw))  # type: ignore[arg-type]


def test_replay_walks_the_step_window_by_window() -> None:
    b = 2
    peaks = {c.where: 0 for c in replay(PROFILE, "none", one_device())}
    for c in replay(PROFILE, "none", one_device()):
        peaks[c.where] = max(peaks[c.where], c.at(b))
    batch = 16 * S * b
    emb = batch + 512 * S * b
    stored = emb + 3 * 800 * S * b
    assert peaks["fwd:pre"] == batch + 600 * S * b
    assert peaks["fwd:dense"] == emb + 2 * 800 * S * b + 1000 * S * b  # third block's forward
    assert peaks["fwd:post"] == stored + 4000 * S * b
    head = stored + 3000 * S * b
    assert peaks["bwd:head"] == head + 3500 * S * b + 4 * 64 * 512
    after_head = head - 3000 * S * b + 4 * 64 * 512
    # each block's backward frees 800/token and leaves G of gradients: with G larger, the
    # highest is the last to run (the model's first block), over two blocks' net growth
    assert peaks["bwd:dense"] == after_head + 2 * (G - 800 * S * b) + 300 * S * b + G
    after_blocks = after_head + 3 * (G - 800 * S * b)
    assert peaks["bwd:embed"] == after_blocks + 9000


def test_gradients_scale_with_sharding_and_join_existing_ones_when_accumulating() -> None:
    b = 1

    def peak(**kw: object) -> int:
        return max(c.at(b) for c in replay(PROFILE, "none", one_device(**kw)))

    full = peak()
    half = peak(grad_scale=0.5)
    assert full - half == pytest.approx(0.5 * (3 * G + 4 * 64 * 512) + 0, abs=8)
    acc = peak(accumulate=True)
    assert acc < full  # the windows' new gradients are already counted in the states


def test_in_flight_micro_batches_hold_their_stored_bytes() -> None:
    b = 3
    one = max(c.at(b) for c in replay(PROFILE, "none", one_device()))
    two = max(c.at(b) for c in replay(PROFILE, "none", one_device(in_flight=2)))
    assert two - one == (512 + 3 * 800) * S * b


def _training(**kw: object) -> Training:
    args: dict[str, object] = {"seq_len": S, "precision": FP32, "implementation": PROFILE}
    return Training.model_validate(args | kw)


def test_estimate_adds_the_replay_to_the_memory_models_states() -> None:
    b = 64
    e = estimate(MODEL, Layout(), _training(micro_batch=b), NONE)
    params = model_total(MODEL, "megatron")
    cands = replay(PROFILE, "none", one_device())
    over = max(c.at(b) for c in cands)
    assert e.peak.bytes.allocated == params * (4 + 8) + over
    assert e.peak_phase == "forward-backward"
    small = estimate(MODEL, Layout(), _training(micro_batch=1), NONE)
    assert small.peak_phase == "optimizer-step"
    assert small.peak.bytes.allocated == params * (4 + 4 + 8 + 4) + 16 * S


def test_plan_agrees_with_estimate_on_a_traced_profile() -> None:
    req = PlanRequest(
        model=MODEL,
        global_batch=8,
        gpu_memory_bytes=100 * 2**20,
        training=_training(),
        overheads=NONE,
        recompute=("none", "full"),  # the profile holds none only: full is not planned
        zero_stages=(0,),
        allow_offload=False,
        margin=0.0,
    )
    result = plan_configs(req)
    assert result.candidates, result
    assert {c.training.recompute for c in result.candidates} == {"none"}
    for c in result.candidates:
        e = estimate(MODEL, c.layout, c.training, NONE)
        assert (c.peak_bytes, c.phase) == (e.peak_bytes, e.peak_phase)


def test_a_profile_of_another_model_or_level_is_refused_by_name() -> None:
    bigger = MODEL.model_copy(update={"layers": 4})
    with pytest.raises(ConfigError, match="traced from a model of"):
        estimate(bigger, Layout(), _training(), NONE)
    with pytest.raises(ConfigError, match="full is not in the profile"):
        estimate(MODEL, Layout(), _training(recompute="full"), NONE)


def test_profile_files_load_by_format_and_newer_ones_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text(PROFILE.model_dump_json())
    assert load_profile(path) == PROFILE
    doc = json.loads(path.read_text())
    doc["version"] = 3
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match="format 3; this dssup reads formats 1 and 2"):
        load_profile(path)
    old = Path(__file__).resolve().parents[3] / "bench" / "accuracy.json"
    v1 = next(iter(json.loads(old.read_text())["profiles"].values()))
    path.write_text(json.dumps(v1))
    assert load_profile(path).kind == "eager"  # type: ignore[union-attr]
    assert hash(PROFILE) == hash(TracedProfile.model_validate_json(PROFILE.model_dump_json()))


def test_leaving_autocast_frees_each_blocks_cached_casts() -> None:
    """amp with checkpointing: every block's forward keeps its bf16 weight casts until autocast
    is left (after the loss); the replay frees them per block, so a model deeper than the
    traced one frees as many as it has blocks (issue 14: +2.3 % before, Llama amp)."""
    cast = 50_000
    released = {"first_released": term(0, cast)}
    block = BLOCK.model_copy(update={"released": term(0, cast)})
    level = LEVEL.model_copy(update={"kinds": {"dense": block}, **released})
    prof = PROFILE.model_copy(update={"levels": {"none": level}})

    def head(p: TracedProfile, blocks: int) -> int:
        st = one_device(order=(("dense", blocks),))
        return max(c.at(1) for c in replay(p, "none", st) if c.where == "bwd:head")

    for blocks in (1, 3, 6):
        assert head(PROFILE, blocks) - head(prof, blocks) == blocks * cast


@pytest.mark.parametrize(
    "layout",
    [
        Layout(pp=2),
        Layout(pp=2, vpp=2, schedule="interleaved"),
    ],
    ids=["1f1b", "interleaved"],  # (DualPipe is refused for a dense model)
)
def test_pipeline_ranks_plan_and_estimate_alike(layout: Layout) -> None:
    """Every rank is replayed (several held stages as one, an upper bound said so); the plan's
    configs re-estimate to the same bytes and phase."""
    model = MODEL.model_copy(update={"layers": 4})
    prof = PROFILE.model_copy(update={"blocks": {"dense": 4}})
    t = _training().model_copy(update={"implementation": prof})
    req = PlanRequest(
        model=model,
        global_batch=8,
        gpu_memory_bytes=100 * 2**20,
        layout=layout,
        training=t,
        overheads=NONE,
        recompute=("none",),
        zero_stages=(0, 1),
        allow_offload=False,
        margin=0.0,
    )
    result = plan_configs(req)
    assert result.candidates, result
    for c in result.candidates:
        e = estimate(model, c.layout, c.training, NONE)
        assert (c.peak_bytes, c.phase) == (e.peak_bytes, e.peak_phase)
        several = " ".join(e.assumptions)
        assert ("replayed as one stage" in several) == (layout.schedule != "1f1b")
    one = estimate(model, layout, t.model_copy(update={"grad_accum": 4}), NONE)
    assert len(one.stages) == 2 and all(st.bytes.activations > 0 for st in one.stages)
