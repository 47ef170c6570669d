"""Certificate rotation while the webhook is under load loses no request.

The Secret volume is laid out the way the kubelet writes it: ``tls.crt -> ..data/tls.crt`` and
``..data -> ..<timestamp>/``, rotated by atomically swapping the ``..data`` symlink. A writer
that is *not* atomic (certificate first, key a moment later) must not break serving either: the
mismatched pair is rejected and the old certificate keeps serving until the key arrives.
"""

import os
import threading
import time
from pathlib import Path

import pytest
from admission_helpers import ApiserverClient, cluster_cache, load, make_ca, make_leaf, review
from cryptography import x509

from dssup.admission import Adapter, Policy
from dssup.admission.server import ServeOptions, start_background

pytestmark = pytest.mark.integration


def _kubelet_secret(root: Path, ca, gen: int) -> int:
    """Write a new pair into ``..<gen>`` and swap ``..data`` to it; returns the serial."""
    d = root / f"..{gen}"
    d.mkdir()
    crt, _ = make_leaf(ca, d)
    tmp = root / "..data_tmp"
    tmp.symlink_to(d.name)
    os.replace(tmp, root / "..data")
    for name in ("tls.crt", "tls.key"):
        if not (root / name).is_symlink():
            (root / name).symlink_to(f"..data/{name}")
    return x509.load_pem_x509_certificate(crt.read_bytes()).serial_number


def _served_serial(port: int, ca) -> int:
    c = ApiserverClient(port, ca.pem())
    c.call("/validate", review(load("job-cpu.yaml")), mutating=False)
    der = c._conn.sock.getpeercert(binary_form=True)
    c.close()
    return x509.load_der_x509_certificate(der).serial_number


def test_rotation_under_load_loses_no_request(tmp_path):
    ca = make_ca()
    serial = _kubelet_secret(tmp_path, ca, 0)
    cache = cluster_cache()
    bg = start_background(
        ServeOptions(
            cert_file=str(tmp_path / "tls.crt"),
            key_file=str(tmp_path / "tls.key"),
            reload_interval_s=0.05,
        ),
        Adapter(Policy(cache)),
        cache,
    )
    stop, errors, done = threading.Event(), [], [0]
    jobs = [
        load("pytorchjob-dsv3-fits.yaml"),
        load("pytorchjob-dsv3-resize.yaml"),
        load("job-cpu.yaml"),
    ]

    def hammer(i: int) -> None:
        client = ApiserverClient(bg.port, ca.pem())
        n = 0
        while not stop.is_set():
            try:
                out = client.admit(jobs[n % 3], reinvoke=False)
                assert out.allowed
                done[0] += 1
            except Exception as exc:  # any failure is a lost request
                errors.append(repr(exc))
            n += 1
            if (
                n % 10 == i
            ):  # new connections (new handshakes) keep arriving, as from kube-apiserver
                client.close()
        client.close()

    threads = [threading.Thread(target=hammer, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    try:
        for gen in range(1, 6):
            time.sleep(0.3)
            serial = _kubelet_secret(tmp_path, ca, gen)
        deadline = time.monotonic() + 10
        while _served_serial(bg.port, ca) != serial and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    try:
        assert errors == []
        assert done[0] > 50
        # Polling may fold two swaps that land between polls into one reload (a busy loop
        # polls late); what must hold is that the last certificate is served.
        assert 1 <= bg.server.reloader.reloads <= 5
        assert _served_serial(bg.port, ca) == serial
    finally:
        bg.stop()


def test_a_half_written_rotation_keeps_the_old_certificate(tmp_path):
    ca = make_ca()
    crt, key = make_leaf(ca, tmp_path)
    old = x509.load_pem_x509_certificate(crt.read_bytes()).serial_number
    cache = cluster_cache()
    bg = start_background(
        ServeOptions(cert_file=str(crt), key_file=str(key), reload_interval_s=0.05),
        Adapter(Policy(cache)),
        cache,
    )
    try:
        new_crt, new_key = make_leaf(ca, tmp_path, stem="next")
        os.replace(new_crt, crt)  # certificate first ...
        time.sleep(0.3)
        assert bg.server.reloader.failures >= 1 and _served_serial(bg.port, ca) == old
        os.replace(new_key, key)  # ... the key a moment later
        deadline = time.monotonic() + 3
        while bg.server.reloader.reloads < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _served_serial(bg.port, ca) != old
    finally:
        bg.stop()
