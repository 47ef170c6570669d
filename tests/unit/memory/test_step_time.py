"""The step-time model ranks like an engineer would: communication on the link it crosses, ZeRO
stages apart by what they move, CPU offload as fast as the host cores behind it, DualPipe's
bubble and overlap as the DeepSeek-V3 report gives them; every figure adds up."""

from __future__ import annotations

import pytest

from dssup.errors import ConfigError
from dssup.memory import GiB, Layout, PlanRequest, Training, plan, preset
from dssup.memory.cost import CostModel, bubble
from dssup.memory.gpus import find_gpu
from dssup.memory.steptime import step_time
from dssup.memory.topology import Topology, default_topology, group_link, topology_for, topology_of

H100 = default_topology()


def _h(name: str) -> Topology:
    spec = find_gpu(name)
    assert spec is not None
    return topology_for(spec)[0]


def test_defaults_come_from_the_gpu_table_with_sources() -> None:
    t = H100
    assert t.gpu == "H100-SXM-80GB" and t.gpus_per_node == 8
    assert t.bf16_flops == pytest.approx(989.4e12) and t.fp8_flops == pytest.approx(1978.9e12)
    assert t.intra_node_bytes_per_s == pytest.approx(450e9)  # NVLink 4: 900 GB/s both ways
    assert t.inter_node_bytes_per_s == pytest.approx(50e9)  # 400 Gb/s NIC per GPU
    assert t.host_cpu_cores == 112 and t.hbm_bytes_per_s == pytest.approx(3.35e12)
    lines = t.describe()
    assert len(lines) == 9 and all("GPU table H100-SXM-80GB" in line for line in lines)
    spec = find_gpu("h100")
    assert spec is not None
    over, _ = topology_for(spec, host_cpu_cores=56, gpus_per_node=4)
    assert over.host_cpu_cores == 56 and over.sources["host_cpu_cores"] == "set on the command line"
    h800, warnings = topology_for(find_gpu("h800"))  # type: ignore[arg-type]
    assert h800.intra_node_bytes_per_s == pytest.approx(200e9) and h800.host_cpu_cores is None
    assert warnings == []


def test_groups_stay_inside_a_node_when_they_fit() -> None:
    nv, nic = 360e9, 46e9
    tp8 = group_link(H100, 8, 1, nic, nv)
    assert tp8.intra and tp8.bytes_per_s == nv
    ep64 = group_link(H100, 64, 1, nic, nv)  # EP64 x ETP1: 64 consecutive GPUs = 8 nodes
    assert not ep64.intra and ep64.nodes == 8 and ep64.per_node == 8
    dp = group_link(H100, 16, 8, nic, nv)  # DP behind TP8: one member per node, one NIC each
    assert dp.nodes == 16 and dp.per_node == 1 and dp.bytes_per_s == nic
    dp2 = group_link(H100, 16, 2, nic, nv)  # 4 members per node: hierarchical, 4 NICs
    assert dp2.per_node == 4 and dp2.bytes_per_s == pytest.approx(4 * nic)


def test_pipeline_bubbles() -> None:
    assert bubble(Layout(pp=16, schedule="1f1b")) == 15
    assert bubble(Layout(pp=16, vpp=3, schedule="interleaved")) == 5
    # DeepSeek-V3 report Table 2: (PP/2 - 1)(F&B + B - 3W) with F:B:W = 1:2:1, in F+B units
    assert bubble(Layout(pp=16, schedule="dualpipe")) == pytest.approx(7 * 2 / 3)
    assert bubble(Layout(pp=1)) == 0


def _one(model: str, layout: Layout, **knobs: object) -> float:
    t = Training(seq_len=4096, **knobs)  # type: ignore[arg-type]
    return step_time(preset(model), layout, t, H100)["total"]


def test_zero_stages_never_tie_when_their_traffic_differs() -> None:
    lay = Layout(tp=2, pp=2, dp=8)
    for m in (4, 16):
        times = [_one("llama-3-8b", lay, grad_accum=m, zero_stage=z) for z in range(4)]
        assert len(set(times)) == 4, times
    # One micro-batch: ZeRO-2 reduce-scatters once, like ZeRO-1, so they move the same bytes
    one = [_one("llama-3-8b", lay, grad_accum=1, zero_stage=z) for z in range(4)]
    assert one[1] == one[2] and len({one[0], one[1], one[3]}) == 3
    # ZeRO-2 reduce-scatters after every micro-batch: more accumulation, more traffic
    assert _one("llama-3-8b", lay, grad_accum=16, zero_stage=2) > _one(
        "llama-3-8b", lay, grad_accum=16, zero_stage=1
    )


def test_cpu_adam_is_as_fast_as_the_cores_each_gpu_gets() -> None:
    m, lay = preset("llama-3-70b"), Layout(tp=8, dp=8)
    t = Training(seq_len=8192, grad_accum=16, zero_stage=1, offload_optimizer=True)
    full = step_time(m, lay, t, H100)["optimizer"]
    half = step_time(m, lay, t, H100.model_copy(update={"host_cpu_cores": 56}))["optimizer"]
    shard = 70.55e9 / 8 / 8  # parameters of one GPU's optimizer shard (TP8, DP8)
    pcie = shard * 6 / H100.host_bytes_per_s  # FP32 gradients down, BF16 weights up
    cpu = shard / (12e6 * 112 / 8)  # 14 cores per GPU at 12 M parameters/s each
    assert full == pytest.approx(pcie + cpu, rel=0.01)
    assert half - full == pytest.approx(cpu, rel=0.01)  # half the cores: the CPU part doubles


def test_llama3_70b_on_64_h100_does_not_rank_offload_first() -> None:
    req = PlanRequest(
        model=preset("llama-3-70b"),
        gpu_memory_bytes=80 * GiB,
        global_batch=128,
        world_size=64,
        training=Training(seq_len=8192),
        search_parallelism=True,
        limit=2000,
    )
    res = plan(req)
    top = res.candidates[0].training
    assert not (top.offload_optimizer or top.offload_params)
    # an offload config ranks above a fitting config without offload only if it is faster
    offload_above: list[float] = []
    for c in res.candidates:
        if c.training.offload_optimizer:
            offload_above.append(c.step_time_s)
            assert c.cost_terms["optimizer"] > 0
        else:
            assert all(t < c.step_time_s for t in offload_above)
    assert res.warnings and "no GPU given" in res.warnings[0]


def test_dualpipe_hides_expert_traffic_behind_compute() -> None:
    m = preset("deepseek-v2-lite")
    dual = Layout(pp=4, ep=16, dp=16, schedule="dualpipe")
    plain = dual.model_copy(update={"schedule": "1f1b"})
    t = Training(seq_len=4096, grad_accum=16, zero_stage=1)
    d, p = step_time(m, dual, t, H100), step_time(m, plain, t, H100)
    assert p["comm.tp_ep_cp_pp"] > 0 and d["comm.tp_ep_cp_pp"] < p["comm.tp_ep_cp_pp"] / 4
    assert d["pipeline.bubble"] < p["pipeline.bubble"]


def test_expert_parallel_across_nodes_costs_nic_time() -> None:
    m = preset("deepseek-v2-lite")
    t = Training(seq_len=4096, grad_accum=8, zero_stage=1)
    inside = step_time(m, Layout(ep=8, dp=64), t, H100)["comm.tp_ep_cp_pp"]
    across = step_time(m, Layout(ep=64, dp=64), t, H100)["comm.tp_ep_cp_pp"]
    assert across > 3 * inside > 0


def test_terms_add_up_and_plan_equals_step_time() -> None:
    req = PlanRequest(
        model=preset("mixtral-8x7b"),
        gpu_memory_bytes=80 * GiB,
        global_batch=128,
        world_size=64,
        layout=Layout(pp=4, ep=8, vpp=8, schedule="interleaved"),
        training=Training(seq_len=4096),
        cost=CostModel(compute_dtype="fp8"),
        topology=H100,
        limit=10_000,
    )
    res = plan(req)
    assert res.candidates and not res.warnings
    prev = 0.0
    for c in res.candidates:
        assert c.step_time_s >= prev
        prev = c.step_time_s
        terms = dict(c.cost_terms)
        total = terms.pop("total")
        assert total == pytest.approx(sum(terms.values()), rel=1e-12)
        assert all(v >= 0 for v in terms.values())
        again = step_time(req.model, c.layout, c.training, H100, req.cost)
        assert again["total"] == pytest.approx(c.step_time_s, rel=1e-12)


def test_search_covers_schedules_and_pins_what_the_user_states() -> None:
    base = PlanRequest(
        model=preset("mixtral-8x7b"),
        gpu_memory_bytes=80 * GiB,
        global_batch=256,
        world_size=32,
        training=Training(seq_len=4096),
        search_parallelism=True,
        topology=H100,
        limit=100_000,
    )
    seen = {(c.layout.schedule, c.layout.vpp) for c in plan(base).candidates}
    assert {("1f1b", 1), ("interleaved", 2), ("interleaved", 4)} <= seen
    assert "dualpipe" not in {s for s, _ in seen}  # Megatron (the default) has no DualPipe
    deepseek = base.model_copy(update={"training": Training(seq_len=4096, framework="deepseek")})
    assert ("dualpipe", 1) in {(c.layout.schedule, c.layout.vpp) for c in plan(deepseek).candidates}
    dual = base.model_copy(
        update={"layout": Layout(pp=2, schedule="dualpipe"), "fixed": ("schedule",)}
    )
    assert {c.layout.schedule for c in plan(dual).candidates} == {"dualpipe"}
    pinned = base.model_copy(
        update={
            "layout": Layout(tp=2, pp=4, schedule="interleaved", vpp=2),
            "fixed": ("tp", "pp", "schedule"),
        }
    )
    got = plan(pinned).candidates
    assert got and {(c.layout.tp, c.layout.pp, c.layout.schedule) for c in got} == {
        (2, 4, "interleaved")
    }
    assert {c.layout.vpp for c in got} <= {2, 4, 8}  # PP x VPP divides the 32 layers


def test_unknown_host_cores_skip_offload_with_a_warning() -> None:
    req = PlanRequest(
        model=preset("llama-3-8b"),
        gpu_memory_bytes=80 * GiB,
        global_batch=64,
        world_size=8,
        training=Training(seq_len=4096),
        topology=_h("h800"),
    )
    res = plan(req)
    assert any("--host-cores" in w for w in res.warnings)
    assert not any(c.training.offload_optimizer for c in res.candidates)
    with pytest.raises(ConfigError, match="host-cores"):
        plan(req.model_copy(update={"offloads": ("optimizer",)}))


def test_fp8_on_a_gpu_without_fp8_is_refused() -> None:
    req = PlanRequest(
        model=preset("llama-3-8b"),
        gpu_memory_bytes=80 * GiB,
        global_batch=64,
        world_size=8,
        cost=CostModel(compute_dtype="fp8"),
        topology=_h("a100-80gb"),
    )
    with pytest.raises(ConfigError, match="compute-dtype"):
        plan(req)


def test_every_searched_layout_is_distinct() -> None:
    from dssup.memory.layouts import search_layouts

    m = preset("deepseek-v3")
    got = list(search_layouts(m, Layout(), 256, 8, 32, dualpipe=True))
    keys = [(x.tp, x.pp, x.ep, x.schedule, x.vpp) for x in got]
    assert len(keys) == len(set(keys))
    assert all(x.world_size == 256 for x in got)
    assert {x.schedule for x in got} == {"1f1b", "dualpipe"}  # 61 layers: no even VPP split
    assert all(x.pp % 2 == 0 for x in got if x.schedule == "dualpipe")
    assert got[0].tp == 1


def test_topology_of_a_node_label_never_fails() -> None:
    """The webhook and the supervisor name the node's GPU: a GPU the table lacks compute figures
    for (A10G) gives no topology (the planner ranks for its default node and warns), not an
    error."""
    h100 = topology_of("NVIDIA-H100-80GB-HBM3")
    assert h100 is not None and h100.gpu == "H100-SXM-80GB"
    assert topology_of("NVIDIA-A10G") is None
    assert topology_of("no-such-gpu") is None and topology_of(None) is None


def test_tp_overlap_follows_the_framework() -> None:
    """Megatron overlaps TP collectives with GEMMs (TransformerEngine ``tp_comm_overlap``);
    a framework that publishes no such overlap (DeepSeek's) leaves its TP traffic exposed,
    unless the cost model states an overlap."""
    m = preset("deepseek-v2-lite")
    lay = Layout(tp=2, ep=8, dp=32)
    meg = Training(seq_len=4096, grad_accum=8, zero_stage=1)
    ds = meg.model_copy(update={"framework": "deepseek"})
    exposed_meg = step_time(m, lay, meg, H100)["comm.tp_ep_cp_pp"]
    exposed_ds = step_time(m, lay, ds, H100)["comm.tp_ep_cp_pp"]
    assert exposed_ds > exposed_meg > 0
    stated = step_time(m, lay, ds, H100, CostModel(tp_overlap=0.5))["comm.tp_ep_cp_pp"]
    assert stated == pytest.approx(exposed_meg, rel=1e-12)
    tp1 = Layout(ep=8, dp=64)  # no TP traffic: the framework's overlap changes nothing
    assert step_time(m, tp1, ds, H100)["total"] == pytest.approx(
        step_time(m, tp1, ds, H100, CostModel(tp_overlap=0.5))["total"], rel=1e-12
    )


def test_a_split_serves_every_schedule_of_its_pp() -> None:
    """A given split (one layer count per stage) is used by 1F1B and DualPipe at its PP, not by
    interleaved schedules or other PPs, which split evenly."""
    from dssup.memory.layouts import search_layouts

    m = preset("deepseek-v2-lite")  # 27 layers
    split = (6, 7, 7, 7)
    base = Layout(pp=4, layers_per_stage=split)
    seen = set()
    for lay in search_layouts(m, base, 64, 8, 8, (), dualpipe=True):
        own = (lay.pp, lay.vpp) == (4, 1)
        assert lay.layers_per_stage == (split if own else None), lay
        if own:
            seen.add(lay.schedule)
    assert seen == {"1f1b", "dualpipe"}
