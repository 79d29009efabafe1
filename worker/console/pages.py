"""The console's pages and their JSON polls (reads only; changes are in changes.py)."""

from __future__ import annotations

import re

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from worker.console.action_feed import newest_actions
from worker.console.audit import recent_changes
from worker.console.chart import per_day_bars, threshold_curve
from worker.console.context import Console
from worker.console.delivery_status import with_delivery
from worker.console.model_list import version_rows
from worker.console.rule_backtest import BacktestError, run_backtest
from worker.console.rule_form import FIELDS, form_of_rule, form_values, rule_of_form
from worker.console.users import user_view
from worker.rules.definition import RuleError, format_duration
from worker.rules.store import read_rule, read_rules

ENTRY_ID = re.compile(r"[0-9]{1,20}-[0-9]{1,20}")
MAX_USER_ID_CHARS = 256


def overview(console: Console):
    def page(request: Request) -> Response:
        return console.page(request, "overview.html", figures=console.overview.figures())

    def poll(request: Request) -> Response:
        return JSONResponse(console.overview.figures())

    return page, poll


def rules(console: Console):
    def page(request: Request) -> Response:
        ruleset = read_rules(console.client, console.keys)
        editing = request.query_params.get("edit", "")
        form = dict.fromkeys(FIELDS, "") | {"min_events": "1", "cooldown": "0"}
        if editing:
            form = form_of_rule(read_rule(console.client, console.keys, editing))
        return console.page(
            request, "rules.html", ruleset=ruleset, form=form, format_duration=format_duration,
            changes=recent_changes(console.client, console.keys),
            saved=request.query_params.get("saved", ""),
        )  # fmt: skip

    async def backtest(request: Request) -> Response:
        form = form_values(dict(request.query_params))
        try:
            rule = rule_of_form(form)
        except RuleError as exc:
            return console.page(request, "backtest.html", status_code=400, form=form,
                                error=str(exc), result=None, valid=False)  # fmt: skip
        try:
            result = await run_in_threadpool(
                run_backtest, console.client, console.keys, console.settings, console.models,
                rule, console.backtest_events,
            )  # fmt: skip
        except BacktestError as exc:
            return console.page(request, "backtest.html", form=form, error=str(exc),
                                result=None, valid=True)  # fmt: skip
        charts = [per_day_bars(result["per_day"]), threshold_curve(result["curve"], rule.above)]
        return console.page(request, "backtest.html", form=form, error=None, result=result,
                            charts=charts, valid=True)  # fmt: skip

    return page, backtest


def users(console: Console):
    def page(request: Request) -> Response:
        user = request.query_params.get("user_id", "").strip()[:MAX_USER_ID_CHARS]
        view = user_view(console.registry, console.models, user) if user else None
        status = 404 if user and view is None else 200
        return console.page(request, "users.html", status_code=status, user=user, view=view)

    return page


def actions(console: Console):
    def page(request: Request) -> Response:
        rows = with_delivery(console.client, console.keys,
                             newest_actions(console.client, console.keys))  # fmt: skip
        return console.page(request, "actions.html", actions=rows)

    def poll(request: Request) -> Response:
        after = request.query_params.get("after", "")
        if after and not ENTRY_ID.fullmatch(after):
            return JSONResponse({"error": "after: not an entry id"}, status_code=400)
        rows = newest_actions(console.client, console.keys, after=after)
        return JSONResponse({"actions": with_delivery(console.client, console.keys, rows)})

    return page, poll


def models(console: Console):
    def page(request: Request) -> Response:
        return console.page(request, "models.html", versions=version_rows(console.registry),
                            said=[], promoted=None)  # fmt: skip

    return page
