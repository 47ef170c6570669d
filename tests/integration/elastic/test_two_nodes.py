"""Two ``dssup run`` processes, each wrapping a real torchrun agent (c10d on 127.0.0.1, gloo,
one rank per node), running the example job as a two-node job on one machine.

Slow by nature: every generation is a real torchrun launch (7-9 s on 2 cores). Measured here,
one at a time: OOM 85-126 s, shrink + scale-up 162-167 s, etcd 108-124 s, ZeRO 119-142 s (9 min).
Timeouts are generous (8 s member timeout, 10 s settle) so a loaded CI box does not turn a
slow start into a one-node first generation.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from dssup.memory.capacity import DEFAULT_MARGIN
from dssup.memory.capacity import budget as fit_budget
from tests.memprobe import MALLOC, cap_between, probe

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.torch]


@pytest.fixture(autouse=True)
def _no_leftovers(tmp_path: Path) -> Any:
    """Kill whatever this test started that is still alive (a SIGKILLed node's torchrun agent
    can hang in its own shutdown): every such process names ``tmp_path`` on its command line."""
    yield
    mark = str(tmp_path).encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if mark in (proc / "cmdline").read_bytes():
                os.kill(int(proc.name), signal.SIGKILL)
        except (OSError, ValueError):
            continue


ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
WORKER = Path(__file__).resolve().parent / "node_worker.py"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _node(
    shared: Path, rank: int, nnodes: str, port: int, dssup: list[str], job: list[str],
    backend: str = "c10d", worker: Path | None = None, env: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:  # fmt: skip
    cmd = [
        str(BIN / "dssup"), "run", "--shared-dir", str(shared), "--node-rank", str(rank),
        "--checkpoint-dir", str(shared / "ckpt"), "--device", "cpu", "--quiet",
        "--heartbeat", "0.5", "--member-timeout", "8", "--settle", "10", *dssup, "--",
        str(BIN / "torchrun"), "--nnodes", nnodes, "--nproc-per-node", "1",
        "--rdzv-backend", backend, "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "job",
        str(worker or WORKER), "--out", str(shared / "final.pt"), *job,
    ]  # fmt: skip
    with (shared / f"node{rank}.out").open("ab") as log:  # the child keeps its own descriptor
        return subprocess.Popen(
            cmd, cwd=shared, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )


def _journal(shared: Path, rank: int) -> list[dict[str, Any]]:
    path = shared / f"node-{rank}" / "journal.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _of(records: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [r for r in records if r["type"] == kind]


def _generations(shared: Path, rank: int) -> list[tuple[Any, ...]]:
    return [
        (g["generation"], tuple(g["nodes"]), g["world_size"], g["rdzv_id"], json.dumps(g["plan"]))
        for g in _of(_journal(shared, rank), "generation")
    ]


def _wait(procs: list[subprocess.Popen[bytes]], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            p.kill()
            codes.append(-9)
    return codes


def _reference(tmp: Path, job: list[str]) -> Path:
    out = tmp / "reference.pt"
    subprocess.run(
        [sys.executable, str(ROOT / "examples" / "train_tiny.py"), "--reference", str(out), *job],
        check=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    return out


def _max_diff(a: Path, b: Path) -> float:
    import torch

    ref, got = torch.load(a), torch.load(b)
    got = {k.removeprefix("module."): v for k, v in got.items()}
    return max(float((ref[k] - got[k]).abs().max()) for k in ref)


def test_oom_on_node_1_gives_one_decision_and_the_same_plan_everywhere(tmp_path: Path) -> None:
    """--nnodes 2: rank on node 1 OOMs (real allocator failure under a memory cap sized by
    what its micro-batch 16 holds when step 2's logits exist, kept for the next generation);
    node 0 only sees its peer vanish. One decision (by node 0, the leader), both relaunch
    with it."""
    job = ["--steps", "4", "--long-from-step", "2", "--checkpoint-every", "1",
           "--memory-cap-at", "forward", "--memory-cap-file", str(tmp_path / "cap-node{node}.json"),
           "--cap-node", "1"]  # fmt: skip
    gb = ["--global-batch-size", "32", "--micro-batch-size", "16"]
    port = _port()
    t0 = time.monotonic()
    procs = [_node(tmp_path, r, "2", port, gb, job) for r in (0, 1)]
    assert _wait(procs, 400) == [0, 0], (tmp_path / "node0.out").read_text()[-3000:]
    elapsed = time.monotonic() - t0
    gens = [_generations(tmp_path, r) for r in (0, 1)]
    assert gens[0] == gens[1] and len(gens[0]) == 2  # identical journal generations
    first, second = (json.loads(g[4]) for g in gens[0])
    assert (first["micro_batch"], first["grad_accum"]) == (16, 1)
    assert (second["micro_batch"], second["grad_accum"]) == (8, 2)
    assert all(json.loads(g[4])["global_batch"] == 32 for g in gens[0])
    leader, follower = _journal(tmp_path, 0), _journal(tmp_path, 1)
    assert [d["action"] for d in _of(leader, "decision")] == ["remedy"]
    assert [d["action"] for d in _of(follower, "decision")] == ["follow"]
    for records in (leader, follower):
        cause = _of(records, "attempt-ended")[0]["failure"]
        assert cause["kind"] == "host-oom" and cause["message"].startswith("node 1:")
    local0 = _of(leader, "attempt-ended")[0]["local_failure"]
    assert local0["kind"] != "host-oom"  # node 0 alone saw only a cascade
    ref = _reference(tmp_path, ["--global-batch-size", "32", "--micro-batch-size", "8",
                                "--steps", "4", "--long-from-step", "2"])  # fmt: skip
    # Same samples, same global batch: only the float summation order differs between two DDP
    # ranks and one process (measured 1.9e-5). A global batch of 16 instead moves the weights
    # by 6.6e-3 on this job, so 2e-4 tells the two apart with a wide margin.
    assert _max_diff(ref, tmp_path / "final.pt") < 2e-4
    print(f"two-node OOM recovery: {elapsed:.1f} s")


def _checkpoints(shared: Path) -> list[int]:
    ckpt = shared / "ckpt"
    if not ckpt.is_dir():
        return []
    return sorted(
        int(p.name.split("_")[1]) for p in ckpt.glob("step_*") if (p / ".metadata").exists()
    )


def _until(pred: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.5)


def _gen_count(shared: Path) -> int:
    return len(list((shared / "generations").glob("g*.json")))


def test_shrink_then_scale_up_keeps_the_global_batch(tmp_path: Path) -> None:
    """--nnodes 1:2: node 1 dies (dssup SIGKILLed; torchrun and workers follow); node 0
    continues alone with twice the accumulation from the checkpoint; node 1 comes back and
    the next generation runs on two nodes again with the original split."""
    job = ["--steps", "24", "--long-from-step", "1000", "--checkpoint-every", "1",
           "--step-delay", "1"]  # fmt: skip
    gb = ["--global-batch-size", "32", "--micro-batch-size", "8"]
    port = _port()
    t0 = time.monotonic()
    n0 = _node(tmp_path, 0, "1:2", port, gb, job)
    n1 = _node(tmp_path, 1, "1:2", port, gb, job)
    _until(lambda: len(_checkpoints(tmp_path)) >= 3, 120, "three checkpoints on two nodes")
    n1.send_signal(signal.SIGKILL)
    n1.wait()
    killed_at = max(_checkpoints(tmp_path))
    _until(lambda: _gen_count(tmp_path) >= 2, 120, "a one-node generation")
    _until(lambda: max(_checkpoints(tmp_path)) >= killed_at + 3, 120, "progress on one node")
    n1 = _node(tmp_path, 1, "1:2", port, gb, job)
    codes = _wait([n0, n1], 400)
    elapsed = time.monotonic() - t0
    assert codes == [0, 0], (tmp_path / "node0.out").read_text()[-3000:]
    gens = _generations(tmp_path, 0)
    shapes = [(g[1], json.loads(g[4])["micro_batch"], json.loads(g[4])["grad_accum"]) for g in gens]
    assert shapes == [((0, 1), 8, 2), ((0,), 8, 4), ((0, 1), 8, 2)]
    for g in gens:
        plan = json.loads(g[4])
        assert plan["micro_batch"] * plan["grad_accum"] * plan["dp"] == 32 == plan["global_batch"]
    assert [g for g in _generations(tmp_path, 1) if g[0] != 2] == [gens[0], gens[2]]
    leader = _journal(tmp_path, 0)
    decisions = _of(leader, "decision")
    assert [d["action"] for d in decisions] == ["membership", "membership"]  # no backoff retries
    assert "lost" in decisions[0]["reason"] and "joined" in decisions[1]["reason"]
    started = _of(leader, "attempt-started")
    assert started[1]["resume_step"] is not None and started[1]["resume_step"] >= 3
    assert started[2]["resume_step"] > started[1]["resume_step"]  # the one-node run progressed
    assert _checkpoints(tmp_path)[-1] == 24
    print(f"shrink + scale-up: {elapsed:.1f} s")


@pytest.fixture
def etcd(tmp_path: Path) -> Any:
    """A real etcd (Debian ``etcd-server``, v2 API on) on loopback ports, for etcd-v2."""
    binary = Path("/usr/bin/etcd")
    pytest.importorskip("etcd", reason="python-etcd (dev extra) is needed for etcd-v2")
    if not binary.exists():
        pytest.skip("etcd-server is not installed (apt-get install etcd-server)")
    client, peer = _port(), _port()
    cmd = [
        str(binary), "--name", "t", "--data-dir", str(tmp_path / "etcd"),
        "--listen-client-urls", f"http://127.0.0.1:{client}",
        "--advertise-client-urls", f"http://127.0.0.1:{client}",
        "--listen-peer-urls", f"http://127.0.0.1:{peer}",
        "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
        "--initial-cluster", f"t=http://127.0.0.1:{peer}", "--enable-v2=true",
    ]  # fmt: skip
    with (tmp_path / "etcd.log").open("ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", client)) == 0:
                break
        time.sleep(0.2)
    yield client
    proc.terminate()
    proc.wait(timeout=30)


def test_etcd_survives_losing_the_first_node(tmp_path: Path, etcd: int) -> None:
    """etcd-v2 rendezvous, --nnodes 1:2: node 0 (the leader, and c10d's store host if it
    were c10d) is SIGKILLed; node 1 takes over the decisions and finishes alone."""
    job = ["--steps", "12", "--long-from-step", "1000", "--checkpoint-every", "1",
           "--step-delay", "1"]  # fmt: skip
    gb = ["--global-batch-size", "32", "--micro-batch-size", "8"]
    t0 = time.monotonic()
    n0 = _node(tmp_path, 0, "1:2", etcd, gb, job, backend="etcd-v2")
    n1 = _node(tmp_path, 1, "1:2", etcd, gb, job, backend="etcd-v2")
    _until(lambda: len(_checkpoints(tmp_path)) >= 3, 150, "three checkpoints on two nodes")
    n0.send_signal(signal.SIGKILL)
    n0.wait()
    assert _wait([n1], 300) == [0], (tmp_path / "node1.out").read_text()[-3000:]
    elapsed = time.monotonic() - t0
    gens = _of(_journal(tmp_path, 1), "generation")
    assert [(g["nodes"], g["leader"]) for g in gens] == [([0, 1], 0), ([1], 1)]
    assert [(g["plan"]["micro_batch"], g["plan"]["grad_accum"]) for g in gens] == [(8, 2), (8, 4)]
    assert _checkpoints(tmp_path)[-1] == 12
    print(f"etcd, first node lost: {elapsed:.1f} s")


ZERO_WORKER = Path(__file__).resolve().parent / "zero_worker.py"
ZERO_PROBE = Path(__file__).resolve().parent / "probe_zero.py"
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 512,
    "intermediate_size": 2048, "num_hidden_layers": 1, "num_attention_heads": 4,
    "num_key_value_heads": 4, "vocab_size": 8192, "max_position_embeddings": 64,
    "tie_word_embeddings": False,
}  # fmt: skip


def _gpu_memory_for_the_demo(config: Path) -> int:
    """A "GPU" on which the memory model says: ZeRO-1 at 2 ranks with micro-batch 8 fits, the
    naive 1-rank restart (micro-batch 8) does not, micro-batch 4 at 1 rank does. Computed from
    the model itself, so the test checks the decision, not a number copied from a run."""
    from dssup.elastic import BatchPlan, MemoryContext
    from dssup.memory import Training
    from dssup.modelio import load_model

    ctx = MemoryContext(model=load_model(str(config)), base=Training(seq_len=64),
                        gpu_memory_bytes=1, zero_stages=(1,), allow_offload=False)  # fmt: skip

    def peak(world: int, mb: int, rc: str = "none") -> int:
        return ctx.peak(BatchPlan(micro_batch=mb, grad_accum=32 // (mb * world), global_batch=32,
                                  dp=world, world_size=world, zero_stage=1, recompute=rc))  # type: ignore[arg-type]  # fmt: skip

    naive = min(peak(1, 8, rc) for rc in ("none", "selective", "full"))
    budget = (peak(1, 4) + naive) // 2
    assert peak(2, 8) < budget < naive
    # ``dssup run`` keeps DEFAULT_MARGIN of the GPU free (none by default): the GPU whose budget
    # is ``budget`` under that margin, so the test follows the margin wherever it is set.
    gpu = math.ceil(budget / (1 - DEFAULT_MARGIN))
    assert fit_budget(gpu, DEFAULT_MARGIN) >= budget
    return gpu


def _real_cap_mib() -> int:
    """The workers' cap: between what a rank needs for the naive 1-node restart (micro-batch 8,
    a moment slice twice as big) and the most that the 2-node run (micro-batch 8) and the
    re-planned 1-node run (micro-batch 4) need, all measured on this machine
    (``probe_zero.py``; about 154, 114 and 120 MiB on a 2-core VM at width 512). Width 512
    makes the moment slice about as large as micro-batch 4's activations, which is what keeps
    the three apart."""
    need = probe(str(ZERO_PROBE), "--dim", "512", "2:8", "1:8", "1:4")
    return cap_between(need["1:8"], max(need["2:8"], need["1:4"]), "the ZeRO-1 shrink")


def test_shrink_under_zero_changes_the_plan_before_the_attempt(tmp_path: Path) -> None:
    """A ZeRO-1 job (moments sharded by rank) under a real memory cap: at 2 nodes micro-batch 8
    fits; node 1 dies; the memory model predicts the naive 1-node restart (micro-batch 8, twice
    the accumulation, but a shard twice as big) will not fit, so the plan for the next
    generation lowers the micro-batch before it starts, and that attempt runs without an OOM.
    The naive restart, run by hand from the same checkpoint under the same cap, does OOM."""
    config = tmp_path / "tiny-llama.json"
    config.write_text(json.dumps(TINY_LLAMA))
    gpu = _gpu_memory_for_the_demo(config)
    dssup = ["--global-batch-size", "32", "--micro-batch-size", "8", "--zero-stage", "1",
             "--model", str(config), "--gpu-memory", f"{gpu}B", "--seq-len", "64"]  # fmt: skip
    cap = _real_cap_mib()
    job = ["--dim", "512", "--steps", "6", "--memory-cap-mib", str(cap), "--step-delay", "1"]
    port = _port()
    t0 = time.monotonic()
    kw = {"worker": ZERO_WORKER, "env": MALLOC}
    n0 = _node(tmp_path, 0, "1:2", port, dssup, job, **kw)  # type: ignore[arg-type]
    n1 = _node(tmp_path, 1, "1:2", port, dssup, job, **kw)  # type: ignore[arg-type]
    _until(lambda: len(_checkpoints(tmp_path)) >= 2, 150, "two checkpoints on two nodes")
    n1.send_signal(signal.SIGKILL)
    n1.wait()
    assert _wait([n0], 400) == [0], (tmp_path / "node0.out").read_text()[-3000:]
    elapsed = time.monotonic() - t0
    records = _journal(tmp_path, 0)
    gens = _of(records, "generation")
    assert [g["nodes"] for g in gens] == [[0, 1], [0]]
    before, after = gens[0]["plan"], gens[1]["plan"]
    assert (before["micro_batch"], before["grad_accum"]) == (8, 2)
    assert after["micro_batch"] < 8 and after["micro_batch"] * after["grad_accum"] == 32
    assert gens[1]["reason"].startswith("world 1: raise-memory")
    ended = _of(records, "attempt-ended")
    assert ended[-1]["failure"] is None  # the re-planned attempt did not OOM
    assert not any(e["failure"] and e["failure"]["kind"] == "host-oom" for e in ended)
    resume = _of(records, "attempt-started")[-1]["resume_from"]
    naive = subprocess.run(
        [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "1", str(ZERO_WORKER), *job],
        env={**os.environ, **MALLOC, "DSSUP_RESUME_FROM": resume, "DSSUP_MICRO_BATCH_SIZE": "8",
             "DSSUP_GRAD_ACCUM_STEPS": "4", "DSSUP_GLOBAL_BATCH_SIZE": "32"},
        capture_output=True, text=True, timeout=300, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert naive.returncode != 0
    assert "can't allocate memory" in naive.stdout + naive.stderr
    print(f"ZeRO shrink with pre-emptive re-plan: {elapsed:.1f} s (cap {cap} MiB)")
