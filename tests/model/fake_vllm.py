"""A stand-in for a vLLM server over HTTP, for tests of failures that need no model."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from shared.ports import free_port as free_port  # re-exported for the tests


class FakeServer:
    """A tiny local HTTP server that answers each (method, path) with a set status and JSON.

    Unlisted paths answer `default` (500 unless set); a path in `delays` answers after that
    many seconds. Every request is recorded in `hits`, its path with the query string in
    `targets`. With a `token`, a request to any path but /health without
    `Authorization: Bearer TOKEN` answers 401, as `evoenv serve` with `serve.api_key` does.
    `port`: a given one (a server that comes back where another was), else a free one.
    """

    def __init__(self, default: int = 500, token: str = "", port: int = 0) -> None:
        self.default = default
        self.token = token
        self.routes: dict[tuple[str, str], tuple[int, Any]] = {}
        self.delays: dict[str, float] = {}
        self.hits: list[tuple[str, str, Any]] = []
        self.targets: list[str] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                path = self.path.split("?", 1)[0]
                fake.hits.append((self.command, path, json.loads(raw) if raw else None))
                fake.targets.append(self.path)
                status, body = fake.routes.get((self.command, path), (fake.default, {"error": "x"}))
                given = self.headers.get("authorization")
                if fake.token and path != "/health" and given != f"Bearer {fake.token}":
                    status, body = 401, {"error": "Unauthorized"}
                time.sleep(fake.delays.get(path, 0.0))
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _answer

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    def paths(self) -> list[str]:
        return [path for _, path, _ in self.hits]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)
