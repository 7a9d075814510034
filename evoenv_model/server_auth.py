"""The model server's bearer token: every route but /health answers 401 without it.

vLLM adds `BearerToken` to its app (`--middleware`, `serve.server_command`, when
`serve.api_key` is set); the token comes from the server's environment, never its command line.
"""

from __future__ import annotations

import hashlib
import os
import secrets

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

API_KEY_VARIABLE = "EVOENV_SERVE__API_KEY"
"""The variable the server process reads the token from (`serve.server_env` sets it)."""
MIDDLEWARE = f"{__name__}.BearerToken"
"""The import path vLLM's `--middleware` takes."""
OPEN_PATHS = frozenset({"/health"})
"""Paths served without the token: the health check that starters and balancers poll."""


class BearerToken:
    """Pure ASGI middleware: a request (HTTP or WebSocket) to any path but `OPEN_PATHS` needs
    `Authorization: Bearer TOKEN`, compared in constant time; without it, 401 (a WebSocket is
    closed before it is accepted). Unlike vLLM's own `--api-key`, which guards only /v1,
    /v2, /inference and /cohere, it also guards the development endpoints (/pause,
    /collective_rpc, /update_weights, ...) that replace the weights.

    With no token (none given, `API_KEY_VARIABLE` empty) it refuses to start."""

    def __init__(self, app: ASGIApp, token: str | None = None) -> None:
        token = os.environ.get(API_KEY_VARIABLE, "") if token is None else token
        if not token:
            raise RuntimeError(f"the server's token check has no token: set {API_KEY_VARIABLE}")
        self.app = app
        self._digest = hashlib.sha256(token.encode()).digest()

    def allows(self, headers: Headers) -> bool:
        scheme, _, given = headers.get("authorization", "").partition(" ")
        digest = hashlib.sha256(given.strip().encode()).digest()
        return scheme.lower() == "bearer" and secrets.compare_digest(digest, self._digest)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or self._passes(scope):
            await self.app(scope, receive, send)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
        else:
            response = JSONResponse(
                {"error": f"unauthorized: send Authorization: Bearer ({API_KEY_VARIABLE})"},
                status_code=401,
                headers={"WWW-Authenticate": "Bearer"},
            )
            await response(scope, receive, send)

    def _passes(self, scope: Scope) -> bool:
        path = str(scope["path"]).removeprefix(scope.get("root_path", ""))
        return path in OPEN_PATHS or self.allows(Headers(scope=scope))
