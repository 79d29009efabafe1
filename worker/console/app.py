"""The console's ASGI app: Starlette routes, the auth middleware, the login page."""

from __future__ import annotations

import redis
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from worker.console import changes, pages
from worker.console.auth import (
    AuthMiddleware,
    change,
    login_response,
    logout_response,
    read_form,
    same_origin,
)
from worker.console.context import HERE, Console
from worker.lifecycle.registry import RegistryError
from worker.rules.definition import RuleError


def login(console: Console):
    def page(request: Request) -> Response:
        return console.page(request, "login.html", error=None)

    async def submit(request: Request) -> Response:
        try:
            form = await read_form(request)
        except ValueError as exc:
            return PlainTextResponse(str(exc), status_code=413)
        role = console.tokens.role_of(form.get("token", ""))
        if role is None or not same_origin(request):
            return console.page(request, "login.html", status_code=401,
                                error="that token opens nothing here")  # fmt: skip
        return login_response(request, console.tokens, role)

    return page, submit


async def logout(request: Request) -> Response:
    return logout_response()


async def _redis_down(request: Request, exc: Exception) -> Response:
    return PlainTextResponse(f"Redis unavailable: {type(exc).__name__}", status_code=503)


async def _refused(request: Request, exc: Exception) -> Response:
    return PlainTextResponse(str(exc), status_code=404)


def build_app(console: Console) -> Starlette:
    """The app: every page behind a token, every change behind auth.change."""
    login_page, login_submit = login(console)
    overview_page, overview_poll = pages.overview(console)
    rules_page, backtest_page = pages.rules(console)
    actions_page, actions_poll = pages.actions(console)
    tokens = console.tokens
    routes = [
        Route("/login", login_page, methods=["GET"]),
        Route("/login", login_submit, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/", overview_page),
        Route("/api/overview", overview_poll),
        Route("/rules", rules_page),
        Route("/rules/backtest", backtest_page),
        Route("/rules/save", change(tokens, changes.save_rule(console)), methods=["POST"]),
        Route("/rules/delete", change(tokens, changes.remove_rule(console)), methods=["POST"]),
        Route("/users", pages.users(console)),
        Route("/actions", actions_page),
        Route("/api/actions", actions_poll),
        Route("/models", pages.models(console)),
        Route("/models/promote", change(tokens, changes.promote_model(console)), methods=["POST"]),
        Route(
            "/models/rollback", change(tokens, changes.rollback_model(console)), methods=["POST"]
        ),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    return Starlette(
        routes=routes,
        middleware=[Middleware(AuthMiddleware, tokens=tokens)],
        exception_handlers={
            redis.RedisError: _redis_down,
            RuleError: _refused,
            RegistryError: _refused,
        },
    )
