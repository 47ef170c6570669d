"""The serving certificate: one live ``SSLContext`` whose certificate is replaced in place.

Kubernetes updates a mounted Secret by swapping a symlink, cert-manager renews before expiry;
``CertReloader.check`` notices a changed file (inode, mtime, size), validates the new pair in a
scratch context first (a half-written rotation or a key that does not match the certificate is
rejected and the old pair keeps serving), then loads it into the live context. New handshakes
get the new certificate; established keep-alive connections are not disturbed, so a rotation
under load loses no request. ALPN offers only ``http/1.1`` (what kube-apiserver asks for).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import ssl
import tempfile
from pathlib import Path

__all__ = ["CertReloader"]

log = logging.getLogger(__name__)


def _context() -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


class CertReloader:
    """Owns the live server context; ``check`` reloads it when the files change."""

    def __init__(self, cert_file: str | Path, key_file: str | Path) -> None:
        self.cert_file = Path(cert_file)
        self.key_file = Path(key_file)
        self.context = _context()
        self.reloads = 0
        self.failures = 0
        self._stamp = self._fingerprint()
        self._load(self.context, validate=True)

    def _fingerprint(self) -> tuple[tuple[int, int, int], ...]:
        out = []
        for path in (self.cert_file, self.key_file):
            try:
                st = path.stat()
            except OSError:
                out.append((0, 0, 0))
            else:
                out.append((st.st_ino, st.st_mtime_ns, st.st_size))
        return tuple(out)

    def _load(self, live: ssl.SSLContext, *, validate: bool) -> None:
        """Copy both files aside, prove the pair in a scratch context, then load the copies."""
        with tempfile.TemporaryDirectory(prefix="dssup-tls-") as tmp:
            cert, key = Path(tmp, "tls.crt"), Path(tmp, "tls.key")
            shutil.copyfile(self.cert_file, cert)
            shutil.copyfile(self.key_file, key)
            os.chmod(key, 0o600)
            if validate:
                _context().load_cert_chain(cert, key)
            live.load_cert_chain(cert, key)

    def check(self) -> bool:
        """Reload if the files changed and the new pair is valid; True when reloaded."""
        stamp = self._fingerprint()
        if stamp == self._stamp:
            return False
        try:
            self._load(self.context, validate=True)
        except (OSError, ssl.SSLError) as exc:
            self.failures += 1
            log.warning("certificate not reloaded (keeping the old one): %s", exc)
            return False
        self._stamp = stamp
        self.reloads += 1
        log.info("serving certificate reloaded from %s", self.cert_file)
        return True

    async def watch(self, interval_s: float = 1.0) -> None:
        """Poll forever (cancel to stop); polling works on every volume type, inotify does not."""
        while True:
            await asyncio.sleep(interval_s)
            self.check()
