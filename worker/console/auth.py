"""Who a request is: a session cookie or `Authorization: Bearer`, else nothing is served;
the login page; and `change`, the one way a route may change anything (editor, CSRF, audit).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlsplit

from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response

from worker.console.tokens import (
    EDITOR,
    SESSION_SECONDS,
    Tokens,
    csrf_ok,
    csrf_token,
    session_cookie,
    session_role,
)

COOKIE = "intentstream_console"
CSRF_HEADER = "x-csrf-token"
# Served to anyone: the login form (and its post). Everything else needs a token.
OPEN_PATHS = frozenset({"/login"})
MAX_FORM_BYTES = 64 * 1024
SECURITY_HEADERS = {
    # no inline script anywhere: a value that slipped past escaping still cannot run
    "content-security-policy": "default-src 'self'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    # not no-referrer: under it a browser sends `Origin: null`, and same_origin needs the origin
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}


@dataclass(frozen=True)
class Identity:
    """A signed-in caller: its role, how it signed in, and who it is in the audit."""

    role: str
    via: str  # "session" or "bearer"
    who: str  # role and token fingerprint, never the token

    @property
    def editor(self) -> bool:
        return self.role == EDITOR


def identify(request: Request, tokens: Tokens) -> Identity | None:
    """The caller's identity from a Bearer token or the session cookie, or None."""
    header = request.headers.get("authorization", "")
    scheme, _, presented = header.partition(" ")
    if scheme.lower() == "bearer" and presented:
        role = tokens.role_of(presented.strip())
        via = "bearer"
    else:
        role = session_role(tokens, request.cookies.get(COOKIE, ""))
        via = "session"
    if role is None:
        return None
    return Identity(role, via, f"{role}:{tokens.fingerprint(role)}")


class AuthMiddleware(BaseHTTPMiddleware):
    """Nothing but the login page without a token; security headers on every response."""

    def __init__(self, app, tokens: Tokens) -> None:
        super().__init__(app)
        self.tokens = tokens

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        identity = identify(request, self.tokens)
        request.state.identity = identity
        if identity is None and request.url.path not in OPEN_PATHS:
            response = _refused(request)
        else:
            response = await call_next(request)
        response.headers.update(SECURITY_HEADERS)
        return response


def _refused(request: Request) -> Response:
    if request.method == "GET" and "text/html" in request.headers.get("accept", ""):
        return RedirectResponse("/login", status_code=303)
    return PlainTextResponse(
        "sign in: /login, or Authorization: Bearer <token>",
        status_code=401,
        headers={"www-authenticate": 'Bearer realm="intentstream console"'},
    )


async def read_form(request: Request) -> dict[str, str]:
    """An urlencoded form's fields (the last value of each), refused past MAX_FORM_BYTES."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise ValueError("form too large")
    return dict(parse_qsl(body.decode("utf-8", errors="replace"), keep_blank_values=True))


def secure(request: Request) -> bool:
    """Whether the request came over TLS (the cookie is then marked Secure)."""
    return request.url.scheme == "https"


def login_response(request: Request, tokens: Tokens, role: str) -> Response:
    """Signed in: the session cookie (HttpOnly, SameSite=Strict, Secure under TLS), to /."""
    response = RedirectResponse("/", status_code=303)
    response.set_cookie(COOKIE, session_cookie(tokens, role), max_age=SESSION_SECONDS,
                        httponly=True, samesite="strict", secure=secure(request))  # fmt: skip
    return response


def logout_response() -> Response:
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(COOKIE, httponly=True, samesite="strict")
    return response


def page_csrf(request: Request, tokens: Tokens) -> str:
    """The CSRF token forms and scripts of this session send back ('' for Bearer callers)."""
    cookie = request.cookies.get(COOKIE)
    return csrf_token(tokens, cookie) if cookie else ""


def same_origin(request: Request) -> bool:
    """An Origin header, when the browser sends one, names this host."""
    origin = request.headers.get("origin")
    if origin is None:
        return True
    return urlsplit(origin).netloc == request.headers.get("host", "")


def change_refusal(request: Request, tokens: Tokens, form: dict[str, str]) -> str | None:
    """Why a change may not go ahead (None: it may): the editor's role, and for a session
    its CSRF token (form field `csrf` or the X-CSRF-Token header) and a same-origin post.
    A Bearer caller needs no CSRF token: a browser never adds that header by itself."""
    identity: Identity | None = request.state.identity
    if identity is None or not identity.editor:
        return "read only: this token may not change anything"
    if identity.via == "bearer":
        return None
    presented = form.get("csrf") or request.headers.get(CSRF_HEADER, "")
    cookie = request.cookies.get(COOKIE, "")
    if not presented or not csrf_ok(tokens, cookie, presented) or not same_origin(request):
        return "CSRF check failed: reload the page and try again"
    return None


Handler = Callable[[Request, dict[str, str]], Awaitable[Response]]


def change(tokens: Tokens, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    """A POST route that changes something: the form read, the refusals checked first."""

    async def route(request: Request) -> Response:
        try:
            form = await read_form(request)
        except ValueError as exc:
            return PlainTextResponse(str(exc), status_code=413)
        refusal = change_refusal(request, tokens, form)
        if refusal is not None:
            if "application/json" in request.headers.get("accept", ""):
                return JSONResponse({"error": refusal}, status_code=403)
            return PlainTextResponse(refusal, status_code=403)
        return await handler(request, form)

    return route
