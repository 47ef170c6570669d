"""The least any Python admission webhook on our stack can do, for ``admission_tls.py``.

Same uvicorn + uvloop + httptools + corked transport + TLS as ``dssup webhook serve``, but the
app only parses the review for its uid and allows it. Latency measured against this server is
the floor of the machine, the load generator and the HTTP/TLS stack; what ``dssup`` measures
above it is the webhook's own cost.
Run by the benchmark: python bench/tls_floor_server.py PORT CERT KEY
"""

from __future__ import annotations

import sys
from typing import Any

import orjson
import uvicorn
import uvloop

from dssup.admission.corked import CorkedHttpToolsProtocol


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    chunks = []
    while True:
        msg = await receive()
        chunks.append(msg.get("body", b""))
        if not msg.get("more_body"):
            break
    uid = orjson.loads(b"".join(chunks))["request"]["uid"]
    body = orjson.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": {"uid": uid, "allowed": True},
        }
    )
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def main() -> None:
    port, cert, key = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        ssl_certfile=cert,
        ssl_keyfile=key,
        http=CorkedHttpToolsProtocol,
        loop="none",
        lifespan="off",
        access_log=False,
        log_config=None,
        server_header=False,
        date_header=False,
    )
    uvloop.run(uvicorn.Server(config).serve())


if __name__ == "__main__":
    main()
