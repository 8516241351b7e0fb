"""Test stand-ins for the services compose.yaml takes from images we cannot fetch here.

    minio server DIR --address :9000 [--console-address :9001]   moto's S3 server on that port
    mc ready ALIAS                          exit 0 when the alias's S3 endpoint answers
    mc mb [--ignore-existing] ALIAS/BUCKET  create a bucket (alias from MC_HOST_<ALIAS>)
    text-embeddings-router --model-id M --port P [--json-output]
        the project's fake embedding server (embed_server.py, copied from the repository)
        on 127.0.0.1, behind a front on 0.0.0.0:P that answers GET /health itself

Credentials are accepted as given (moto checks none). Runs inside the stand-in image only.
"""

from __future__ import annotations

import http.client
import os
import signal
import sys
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

DIMENSIONS = {"BAAI/bge-m3": 1024}


def _stop_on_sigterm() -> None:
    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)


def _option(args: list[str], name: str, default: str) -> str:
    return args[args.index(name) + 1] if name in args else default


def minio(args: list[str]) -> int:
    if not args or args[0] != "server":
        print(f"minio stand-in: only `server` is supported, got {args}", file=sys.stderr)
        return 2
    port = _option(args, "--address", ":9000").rpartition(":")[2]
    from moto.server import main as moto_main

    _stop_on_sigterm()
    print(f"minio stand-in: moto S3 server on 0.0.0.0:{port}", flush=True)
    moto_main(["-H", "0.0.0.0", "-p", port])
    return 0


def _alias(name: str) -> tuple[str, str | None, str | None]:
    url = os.environ.get(f"MC_HOST_{name}")
    if url is None and name == "local":
        url = "http://127.0.0.1:9000"
    if url is None:
        raise SystemExit(f"mc stand-in: no MC_HOST_{name}")
    parts = urlsplit(url)
    endpoint = f"{parts.scheme}://{parts.hostname}:{parts.port or 80}"
    return endpoint, parts.username, parts.password


def mc(args: list[str]) -> int:
    if args[:1] == ["ready"] and len(args) == 2:
        endpoint, _, _ = _alias(args[1])
        try:
            with urllib.request.urlopen(endpoint + "/", timeout=5):
                return 0
        except urllib.error.HTTPError:
            return 0  # it answered
        except OSError as error:
            print(f"mc stand-in: {args[1]} not ready: {error}", file=sys.stderr)
            return 1
    if args[:1] == ["mb"]:
        target = [a for a in args[1:] if not a.startswith("--")]
        alias, _, bucket = target[0].partition("/")
        endpoint, user, password = _alias(alias)
        from minio import Minio

        parts = urlsplit(endpoint)
        client = Minio(
            parts.netloc, access_key=user, secret_key=password, secure=parts.scheme == "https"
        )
        if client.bucket_exists(bucket):
            if "--ignore-existing" in args:
                print(f"Bucket `{target[0]}` already exists.")
                return 0
            return 1
        client.make_bucket(bucket)
        print(f"Bucket created successfully `{target[0]}`.")
        return 0
    print(f"mc stand-in: unsupported {args}", file=sys.stderr)
    return 2


def text_embeddings_router(args: list[str]) -> int:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from embed_server import FakeEmbedServer

    model = _option(args, "--model-id", "BAAI/bge-m3")
    port = int(_option(args, "--port", "80"))
    dimension = int(os.environ.get("STANDIN_EMBEDDING_DIMENSION", DIMENSIONS.get(model, 1024)))
    fake = FakeEmbedServer(dimension=dimension, model_id=model).start()

    class Front(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _relay(self) -> None:
            if self.path == "/health":
                self._answer(200, "text/plain", b"ok")
                return
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            upstream = http.client.HTTPConnection("127.0.0.1", fake.port, timeout=None)
            try:
                headers = {"Content-Type": self.headers.get("Content-Type", "application/json")}
                upstream.request(self.command, self.path, body=body, headers=headers)
                answer = upstream.getresponse()
                data = answer.read()
                kind = answer.getheader("Content-Type", "application/json")
                self._answer(answer.status, kind, data)
            except (OSError, http.client.HTTPException):
                self.close_connection = True
            finally:
                upstream.close()

        def _answer(self, status: int, kind: str, data: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _relay

    front = ThreadingHTTPServer(("0.0.0.0", port), Front)
    front.daemon_threads = True
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    threading.Thread(target=front.serve_forever, daemon=True).start()
    print(f"tei stand-in: fake embedding server ({model}, {dimension} dims) on :{port}", flush=True)
    stop.wait()
    front.shutdown()
    fake.stop()
    return 0


def main() -> int:
    command, args = sys.argv[1], sys.argv[2:]
    handlers = {"minio": minio, "mc": mc, "text-embeddings-router": text_embeddings_router}
    return handlers[command](args)


if __name__ == "__main__":
    sys.exit(main())
