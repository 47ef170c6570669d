"""Webhook latency and throughput over TLS with keep-alive, on 127.0.0.1 only, bounded in time.

Starts ``dssup webhook serve`` (one process, uvloop + httptools) with a throw-away CA and
certificate, then drives it from this process with an asyncio/uvloop HTTP/1.1 client that
verifies the certificate the way kube-apiserver does (SAN ``dssup-webhook.dssup-system.svc``,
CA-only trust), reuses connections and checks every answer (HTTP 200, same uid).

Scenarios (G2/G3): paced 200 / 400 / 600 req/s over 4 connections (targets p50 <= 1 ms,
p99 <= 5 ms; p99.9 and max reported) and saturation with 16 connections (target >= 1,000
reviews/s, p99 <= 25 ms, no errors), each for two traffic mixes:

- repeat: the same DeepSeek-V3 job validated again and again, 1 in 8 a mutate that resizes (the
  webhook's memo answers; controller UPDATEs and re-invocations look like this);
- create: every job new (a unique RUN_ID env var): POST /mutate of the job, then POST /validate of
  the object it admitted, on the same connection; the mutate runs the whole decision path (only
  the estimate cache is warm), the validate reuses the evaluation.

First, the same paced scenarios against ``tls_floor_server.py``: the same HTTP/TLS stack with an
app that only parses the uid and allows. That is the floor of this machine and load generator
(idle CPUs wake slowly between paced requests); the rows of dssup are to be read against it.
Note the load generator shares the CPUs with the server.
Run: .venv/bin/python bench/admission_tls.py [--seconds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jsonpatch
import uvloop

sys.path.insert(0, str(Path(__file__).parents[1] / "tests" / "fixtures" / "admission"))
from admission_helpers import (
    SAN,
    client_context,
    cluster_cache,
    free_port,
    load,
    make_ca,
    make_leaf,
    review,
    serve_process,
    wait_ready,
)
from admission_inprocess import fresh

from dssup.admission import Policy


def _request(path: str, uid: str, obj: dict) -> tuple[str, bytes, bytes]:
    return path, json.dumps(review(obj, uid=uid)).encode(), uid.encode()


def _http(path: str, body: bytes) -> bytes:
    head = (
        f"POST {path}?timeout=2s HTTP/1.1\r\nHost: {SAN}\r\nContent-Type: application/json\r\n"
        f"Accept: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    return head + body


async def _exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, req: bytes, uid: bytes
) -> None:
    writer.write(req)
    head = await reader.readuntil(b"\r\n\r\n")
    status = head.split(b" ", 2)[1]
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length")
    )
    body = await reader.readexactly(length)
    if status != b"200" or uid not in body:
        raise RuntimeError(f"bad answer {status!r}")


class Repeat:
    """A fixed list of requests, cycled."""

    def __init__(self, reqs: list[tuple[str, bytes, bytes]]) -> None:
        self.reqs = reqs

    def __call__(self, conn: int, i: int) -> tuple[str, bytes, bytes]:
        return self.reqs[i % len(self.reqs)]


class Create:
    """Job ``(conn, i // 2)`` is new: even ``i`` mutates it, odd ``i`` validates what was admitted."""

    def __init__(self, job: dict) -> None:
        marked = fresh(job, 0)
        patch = Policy(cluster_cache()).judge(marked, "team-a", "mutate").patch
        admitted = jsonpatch.apply_patch(marked, list(patch))
        self.templates = [
            ("/mutate", json.dumps(review(marked, uid="UID-X"))),
            ("/validate", json.dumps(review(admitted, uid="UID-X"))),
        ]

    def __call__(self, conn: int, i: int) -> tuple[str, bytes, bytes]:
        path, text = self.templates[i % 2]
        uid = f"c{conn}-{i}"
        body = text.replace("run-0", f"run-{conn}-{i // 2}").replace("UID-X", uid)
        return path, body.encode(), uid.encode()


async def _conn(
    port: int, ctx, make, conn_id: int, rate: float | None, until: float, lat: list, errors: list
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname=SAN)
    interval = 1.0 / rate if rate else 0.0
    nxt = time.perf_counter()
    i = 0
    while time.perf_counter() < until:
        if interval:
            delay = nxt - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            nxt += interval
        path, body, uid = make(conn_id, i)
        req = _http(path, body)
        i += 1
        t0 = time.perf_counter()
        try:
            await _exchange(reader, writer, req, uid)
        except Exception as exc:
            errors.append(repr(exc))
            break
        lat.append(time.perf_counter() - t0)
    writer.close()


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1e3 if xs else float("nan")


async def _scenario(port: int, ctx, make, conns: int, rate: float | None, seconds: float) -> dict:
    lat: list[float] = []
    errors: list[str] = []
    start = time.perf_counter()
    until = start + seconds
    per_conn = rate / conns if rate else None
    await asyncio.gather(
        *(_conn(port, ctx, make, c, per_conn, until, lat, errors) for c in range(conns))
    )
    wall = time.perf_counter() - start
    return {
        "n": len(lat),
        "rps": len(lat) / wall,
        "p50": _pct(lat, 0.5),
        "p99": _pct(lat, 0.99),
        "p999": _pct(lat, 0.999),
        "max": max(lat) * 1e3 if lat else float("nan"),
        "errors": len(errors),
    }


def _cpu_s(pid: int) -> float:
    """User+system CPU seconds of the server process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _print(label: str, r: dict) -> None:
    print(
        f"{label:<34} n={r['n']:>6} {r['rps']:>7.0f} req/s  p50 {r['p50']:6.2f} ms  p99 {r['p99']:6.2f} ms  "
        f"p99.9 {r['p999']:6.2f} ms  max {r['max']:7.2f} ms  errors {r['errors']}"
    )


def _curl(port: int, cafile: Path, make, rate: int, seconds: float, work: Path) -> dict | None:
    """Paced over 4 keep-alive connections by curl (C and OpenSSL, one process per connection,
    ``--rate``): a native client like kube-apiserver's, so the figures carry less of the load
    generator's own Python cost. Latency = time_total - time_pretransfer of each transfer (the
    first transfer of each connection, with its handshake, is left out). None without curl."""
    curl = shutil.which("curl")
    if curl is None:
        return None
    conns, per = 4, rate // 4
    n = max(2, int(per * seconds))
    procs = []
    for c in range(conns):
        lines = []
        for i in range(n):
            path, body, _ = make(c, i)
            f = work / f"c{c}-{i}.json"
            f.write_bytes(body)
            lines += [
                f'url = "https://{SAN}:{port}{path}?timeout=2s"',
                f'resolve = "{SAN}:{port}:127.0.0.1"',
                f'cacert = "{cafile}"',
                "http1.1",
                'header = "Content-Type: application/json"',
                f'data-binary = "@{f}"',
                'output = "/dev/null"',
                "silent",
                'write-out = "%{time_total} %{time_pretransfer} %{http_code}\\n"',
            ]
            if i < n - 1:
                lines.append("next")
        cfg = work / f"c{c}.cfg"
        cfg.write_text("\n".join(lines))
        cmd = [curl, "--rate", f"{per}/s", "-K", str(cfg)]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True))
    start = time.perf_counter()
    lat: list[float] = []
    errors = 0
    for proc in procs:
        out, _ = proc.communicate(timeout=seconds * 4 + 30)
        rows = [line.split() for line in out.splitlines() if line.strip()]
        errors += n - len(rows) + sum(r[2] != "200" for r in rows)
        lat += [float(r[0]) - float(r[1]) for r in rows[1:]]
    wall = time.perf_counter() - start
    return {
        "n": len(lat),
        "rps": (len(lat) + conns) / wall,
        "p50": _pct(lat, 0.5),
        "p99": _pct(lat, 0.99),
        "p999": _pct(lat, 0.999),
        "max": max(lat) * 1e3 if lat else float("nan"),
        "errors": errors,
    }


def _wait_port(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _floor(ctx, crt: Path, key: Path, reqs: list, seconds: float, native) -> dict[int, dict]:
    """Paced scenarios against the floor server (same stack, trivial app); ``native(port,
    label)`` runs the curl scenarios against it too."""
    port = free_port()
    server = Path(__file__).with_name("tls_floor_server.py")
    proc = subprocess.Popen([sys.executable, str(server), str(port), str(crt), str(key)])
    try:
        _wait_port(port)
        make = Repeat(reqs)
        uvloop.run(_scenario(port, ctx, make, 4, 100, 1.0))  # warm-up
        out = {}
        for rate in (200, 400, 600):
            out[rate] = uvloop.run(_scenario(port, ctx, make, 4, rate, seconds))
            _print(f"floor: paced {rate} req/s, 4 conns", out[rate])
        native(port, "floor", Repeat(reqs))
        return out
    finally:
        proc.terminate()
        proc.wait(10)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=5.0, help="duration of each scenario")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="dssup-bench-"))
    ca = make_ca()
    crt, key = make_leaf(ca, tmp)
    proc, port, health = serve_process(crt, key, global_args=("--log-level", "WARNING"))
    try:
        wait_ready(proc, health)
        ctx = client_context(ca.pem())
        dsv3, big = load("pytorchjob-dsv3-fits.yaml"), load("pytorchjob-dsv3-resize.yaml")
        reqs = []
        for i in range(64):  # validate on the fitting DeepSeek-V3 job, 1 in 8 a mutate that resizes
            path, obj = ("/mutate", big) if i % 8 == 7 else ("/validate", dsv3)
            uid = f"bench-{i:04d}"
            reqs.append(_request(path, uid, obj))
        print(
            f"server: dssup webhook serve (1 process), 127.0.0.1:{port}; {os.cpu_count()} CPUs shared "
            f"with this load generator; {args.seconds:.0f} s per scenario"
        )
        cafile = tmp / "ca.pem"
        cafile.write_bytes(ca.pem())
        native_rows: dict[tuple[str, int], dict] = {}

        def native(port_: int, label: str, make) -> None:
            for rate in (200, 400, 600):
                work = Path(tempfile.mkdtemp(prefix="curl-", dir=tmp))
                r = _curl(port_, cafile, make, rate, args.seconds, work)
                shutil.rmtree(work, ignore_errors=True)
                if r is None:
                    print("curl not found: native-client scenarios skipped")
                    return
                native_rows[(label, rate)] = r
                _print(f"{label}: curl, paced {rate} req/s, 4 conns", r)

        floor = _floor(ctx, crt, key, reqs, args.seconds, native)
        mixes = {"repeat": Repeat(reqs), "create": Create(dsv3)}
        uvloop.run(_scenario(port, ctx, mixes["repeat"], 4, 100, 2.0))  # warm-up
        met = {}
        for mix, make in mixes.items():
            paced = []
            for rate in (200, 400, 600):
                r = uvloop.run(_scenario(port, ctx, make, 4, rate, args.seconds))
                _print(f"{mix}: paced {rate} req/s, 4 conns", r)
                print(
                    f"{'':<34} above the floor: p50 {r['p50'] - floor[rate]['p50']:+.2f} ms, "
                    f"p99 {r['p99'] - floor[rate]['p99']:+.2f} ms"
                )
                paced.append(r["p50"] <= 1 and r["p99"] <= 5 and r["errors"] == 0)
            cpu0 = _cpu_s(proc.pid)
            sat = uvloop.run(_scenario(port, ctx, make, 16, None, args.seconds))
            cpu = _cpu_s(proc.pid) - cpu0
            _print(f"{mix}: saturation, 16 conns", sat)
            per = cpu / max(1, sat["n"]) * 1e3
            print(
                f"{mix}: server CPU per review {per:.2f} ms -> one worker with a whole core: "
                f"{1000 / per:.0f} reviews/s"
            )
            met[f"G2 {mix} (paced: p50 <= 1 ms, p99 <= 5 ms), asyncio client"] = all(paced)
            native(port, mix, make)
            rows = [native_rows.get((mix, rate)) for rate in (200, 400, 600)]
            if all(rows):
                met[f"G2 {mix} (paced: p50 <= 1 ms, p99 <= 5 ms), curl client"] = all(
                    r["p50"] <= 1 and r["p99"] <= 5 and r["errors"] == 0 for r in rows
                )
            met[f"G3 {mix} (>= 1000 req/s, p99 <= 25 ms, 0 errors)"] = (
                sat["rps"] >= 1000 and sat["p99"] <= 25 and sat["errors"] == 0
            )
        floors = {
            "asyncio client": max(r["p50"] for r in floor.values()),
            "curl client": max(
                (r["p50"] for (label, _), r in native_rows.items() if label == "floor"),
                default=float("nan"),
            ),
        }
        for label, ok in met.items():
            client = next((c for c in floors if label.endswith(c)), None)
            context = f" (this client's floor: p50 up to {floors[client]:.2f} ms)" if client else ""
            print(f"{label}: {'MET' if ok else 'MISSED'}{context}")
        print(f"load average now {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    finally:
        proc.terminate()
        proc.wait(10)


if __name__ == "__main__":
    main()
