"""The console's changes: save and delete a rule (the same code path as `intentstream rules
set` and `rules delete`), promote and roll back a model (the CLI's promotion gate), each
recorded in the audit stream. Every one is wrapped by auth.change (editor, CSRF)."""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response

from worker.console.audit import record
from worker.console.context import Console
from worker.console.model_list import promote, version_rows
from worker.console.rule_form import form_values, rule_of_form
from worker.lifecycle.registry import RegistryError
from worker.rules.definition import RuleError, rule_to_dict
from worker.rules.store import delete_rule, set_rule


def _remote(request: Request) -> str:
    return request.client.host if request.client else ""


def _audit(console: Console, request: Request, action: str, detail: dict) -> None:
    record(console.client, console.keys, request.state.identity, action, detail, _remote(request))


def save_rule(console: Console):
    async def handler(request: Request, form: dict[str, str]) -> Response:
        try:
            rule = rule_of_form(form)
            version = await run_in_threadpool(set_rule, console.client, console.keys, rule)
        except RuleError as exc:
            return console.page(request, "backtest.html", status_code=400,
                                form=form_values(form), error=str(exc), result=None,
                                valid=False)  # fmt: skip
        _audit(console, request, "rules.set", rule_to_dict(rule) | {"version": version})
        return RedirectResponse(f"/rules?saved={rule.name}", status_code=303)

    return handler


def remove_rule(console: Console):
    async def handler(request: Request, form: dict[str, str]) -> Response:
        name = form.get("name", "")
        try:
            version = await run_in_threadpool(delete_rule, console.client, console.keys, name)
        except RuleError as exc:
            return PlainTextResponse(str(exc), status_code=404)
        _audit(console, request, "rules.delete", {"name": name, "version": version})
        return RedirectResponse("/rules", status_code=303)

    return handler


def promote_model(console: Console):
    async def handler(request: Request, form: dict[str, str]) -> Response:
        version = form.get("version", "")
        try:
            done, said = await run_in_threadpool(promote, console.registry, version)
        except RegistryError as exc:
            done, said = False, [str(exc)]
        _audit(console, request, "model.promote",
               {"version": version, "promoted": done, "gate": said})  # fmt: skip
        return console.page(request, "models.html", status_code=200 if done else 409,
                            versions=version_rows(console.registry), said=said,
                            promoted=done)  # fmt: skip

    return handler


def rollback_model(console: Console):
    async def handler(request: Request, form: dict[str, str]) -> Response:
        try:
            version = await run_in_threadpool(console.registry.rollback)
            done, said = True, [f"version {version} is current again"]
        except RegistryError as exc:
            done, said, version = False, [str(exc)], None
        _audit(console, request, "model.rollback", {"version": version, "done": done})
        return console.page(request, "models.html", status_code=200 if done else 409,
                            versions=version_rows(console.registry), said=said,
                            promoted=done)  # fmt: skip

    return handler
