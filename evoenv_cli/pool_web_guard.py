"""The outermost layer of `evoenv pool serve`'s app: basic auth, the security headers on every
response, and a 500 page for a page that fails, logged without a credential."""

from __future__ import annotations

import base64
import binascii
import secrets
import traceback
from collections.abc import Callable

import structlog
from pydantic import SecretStr
from starlette.datastructures import Headers, MutableHeaders
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = structlog.get_logger(__name__)

SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'self'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
"""Sent with every response: no script runs, nothing loads from elsewhere, no page embeds it."""
REALM = 'Basic realm="evoenv pool", charset="UTF-8"'


class Guard:
    """The outermost layer of the app's own: answers 401 to a request without `credentials`
    (when set), adds `SECURITY_HEADERS` to every response, and turns an exception of a page
    into a 500 page (`failed`), logged as `pool_web_failed` with its traceback: no values of
    locals, and the password, the basic-auth token and the request's Authorization header
    replaced wherever they would appear."""

    def __init__(
        self,
        app: ASGIApp,
        credentials: tuple[bytes, bytes] | None,
        failed: Callable[[], Response],
    ) -> None:
        self.app = app
        self.credentials = credentials
        self.failed = failed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def secured(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                MutableHeaders(scope=message).update(SECURITY_HEADERS)
            await send(message)

        if self.credentials is not None and not _authorised(Request(scope), self.credentials):
            denied = PlainTextResponse(
                "authentication required\n", 401, headers={"WWW-Authenticate": REALM}
            )
            await denied(scope, receive, secured)
            return
        try:
            await self.app(scope, receive, secured)
        except Exception as exc:  # noqa: BLE001 - any page that fails is a logged 500
            log.error(
                "pool_web_failed",
                method=scope.get("method"),
                path=scope.get("path"),
                exception=self._redacted("".join(traceback.format_exception(exc)), scope),
            )
            if started:  # nothing more can be said on this response
                return
            await self.failed()(scope, receive, secured)

    def _redacted(self, text: str, scope: Scope) -> str:
        hidden = [Headers(scope=scope).get("authorization", "")]
        if self.credentials is not None:
            user, password = self.credentials
            hidden.append(password.decode("utf-8"))
            hidden.append(base64.b64encode(user + b":" + password).decode("ascii"))
        for secret in sorted(filter(None, hidden), key=len, reverse=True):
            text = text.replace(secret, "[redacted]")
        return text


def credentials(user: str, password: SecretStr) -> tuple[bytes, bytes]:
    return user.encode("utf-8"), password.get_secret_value().encode("utf-8")


def _authorised(request: Request, expected: tuple[bytes, bytes]) -> bool:
    """Whether the request carries the expected basic-auth user and password: both compared in
    constant time, whatever the first comparison gave."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "basic":
        return False
    try:
        decoded = base64.b64decode(token.strip(), validate=True)
    except (binascii.Error, ValueError):
        return False
    user, sep, password = decoded.partition(b":")
    same_user = secrets.compare_digest(user, expected[0])
    same_password = secrets.compare_digest(password, expected[1])
    return bool(sep) and same_user and same_password
