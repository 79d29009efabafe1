"""What every page of the console reads: the settings, the Redis client, the registry, the
tokens, the cached overview and current model, and the templates."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.templating import Jinja2Templates

from worker.common.connection import Client, connect_settings
from worker.common.keys import Keys
from worker.common.settings import Settings
from worker.console.auth import page_csrf
from worker.console.current_model import CurrentModel
from worker.console.overview import Overview
from worker.console.tokens import Tokens
from worker.lifecycle.registry import Registry

HERE = Path(__file__).parent
# The newest retained events per partition a rule's backtest replays (the console's flag).
DEFAULT_BACKTEST_EVENTS = 100_000


@dataclass
class Console:
    """One console process's shared state."""

    settings: Settings
    tokens: Tokens
    client: Client
    keys: Keys
    registry: Registry
    overview: Overview
    models: CurrentModel
    templates: Jinja2Templates
    backtest_events: int = DEFAULT_BACKTEST_EVENTS

    def page(self, request: Request, name: str, status_code: int = 200, **context) -> HTMLResponse:
        """A page from its template, with who is signed in and the session's CSRF token."""
        identity = request.state.identity
        return self.templates.TemplateResponse(
            request,
            name,
            {"identity": identity, "csrf": page_csrf(request, self.tokens), **context},
            status_code=status_code,
        )


def make_console(settings: Settings, tokens: Tokens, backtest_events: int) -> Console:
    """A console on the Redis the settings name."""
    client = connect_settings(settings)
    keys = Keys(settings.prefix)
    registry = Registry(client, settings.prefix)
    templates = Jinja2Templates(directory=HERE / "templates")
    return Console(
        settings=settings,
        tokens=tokens,
        client=client,
        keys=keys,
        registry=registry,
        overview=Overview(client, keys, settings.group, settings.partitions),
        models=CurrentModel(registry, settings.max_model_bytes),
        templates=templates,
        backtest_events=backtest_events,
    )
