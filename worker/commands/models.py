"""The `intentstream model ...` sub-commands: artifacts on disk and the registry in Redis."""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

from model.artifact import ArtifactError, Model, file_sha256, load_model, save_model
from model.feature_names import expand_features
from model.inputs import parse_inputs
from model.random_init import random_model
from worker.commands.event_files import read_event_files
from worker.commands.input_flags import describe_inputs, input_declarations
from worker.commands.registry_access import with_registry
from worker.common.partition_count import recorded_partitions
from worker.lifecycle.history import read_history
from worker.lifecycle.registry import Registry, RegistryError


def cmd_model_init(args: argparse.Namespace) -> int:
    # invalid values raise pydantic's ValidationError: main() names the flag in one line
    declared = [
        {"mean": 0.0, "scale": 1.0} | d if d.get("kind") == "numeric" else d
        for d in input_declarations(args)
    ]  # an untrained model: numeric inputs as they come (mean 0, scale 1) unless given
    model = random_model(
        event_types=args.event_types,
        hidden=args.hidden,
        layers=args.layers,
        features=expand_features(args.features, args.event_types),
        embedding_dim=args.embedding_dim,
        head=args.head,
        session_gap_seconds=args.session_gap,
        seed=args.seed,
        cell=args.cell,
        inputs=parse_inputs(declared) if declared else None,
        wide_head=args.wide_head,
    )
    digest = save_model(model, args.out)
    print(f"wrote {args.out} ({model.parameter_count()} parameters, sha256 {digest})")
    if declared:
        print("inputs:\n" + "\n".join(describe_inputs(model.inputs)))
    return 0


def describe_model(model: Model) -> str:
    """Human-readable summary: config, array shapes, parameter count."""
    meta = model.meta
    lines = [
        f"format:        {meta.format}",
        f"cell:          {meta.cell}, {meta.layers} layer(s), hidden {meta.hidden}",
        f"head:          {meta.head}"
        + (", wide (reads x's numeric columns)" if meta.wide_head else ""),
        f"event types:   {', '.join(meta.event_types)} (+ reserved row for unknown types)",
        f"features:      {', '.join(meta.features) or '(none)'}",
        f"embedding dim: {model.embedding_dim}",
        f"session gap:   {meta.session_gap_seconds:g} s"
        + (" (never)" if not meta.session_gap_seconds else ""),
        f"version:       {model.version}",
        "arrays:",
    ]
    for name, a in model.arrays.items():
        lines.append(f"  {name:<16} {a.dtype!s:<8} {'x'.join(map(str, a.shape))}")
    lines.append(f"parameters:    {model.parameter_count()}")
    if len(model.inputs):
        lines += ["inputs:", *describe_inputs(model.inputs)]
    extra = {k: v for k, v in (meta.model_extra or {}).items() if k != "version"}
    if extra:
        lines.append(f"meta:          {json.dumps(extra, sort_keys=True)}")
    return "\n".join(lines)


def cmd_model_show(args: argparse.Namespace) -> int:

    if not args.file.isdigit():  # a version; a file named like one: ./2
        try:
            model = load_model(args.file)
        except ArtifactError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(describe_model(model))
        print(f"sha256:        {file_sha256(args.file)}")
        return 0
    return with_registry(args, lambda reg: _show_version(reg, args.file))


def _show_version(registry: Registry, version: str) -> int:
    meta = registry.meta(version)
    model = registry.load(version)
    current = registry.current()
    print(describe_model(model).replace("version:       file", f"version:       {version}"))
    print(f"sha256:        {meta.get('sha256')}")
    print(f"current:       {'yes' if current == version else 'no'}")
    return 0


def cmd_model_publish(args: argparse.Namespace) -> int:
    def publish(reg: Registry) -> int:
        try:
            data = Path(args.file).read_bytes()
        except OSError as exc:
            raise RegistryError(f"cannot read {args.file}: {exc.strerror}") from None
        version = reg.publish(data)
        if not args.promote:
            print(f"published version {version}")
            return 0
        return promoted(reg, version, args.force, f"published version {version}")

    return with_registry(args, publish)


def cmd_model_list(args: argparse.Namespace) -> int:
    def listing(reg: Registry) -> int:
        current = reg.current()
        print(f"{'':2}{'version':>8}  {'published (UTC)':<20} {'layers':>6} {'hidden':>6}  sha256")
        for v in reg.versions():
            m = reg.meta(v)
            when = datetime.datetime.fromtimestamp(m.get("published_at", 0), datetime.timezone.utc)
            mark = "* " if v == current else "  "
            print(f"{mark}{v:>8}  {when:%Y-%m-%d %H:%M:%S}  {m.get('layers', '?'):>6} "
                  f"{m.get('hidden', '?'):>6}  {str(m.get('sha256', ''))[:16]}")  # fmt: skip
        return 0

    return with_registry(args, listing)


def promoted(reg: Registry, version: str, force: bool, published: str = "", say=print) -> int:
    """Make `version` current behind the promotion gate (worker/lifecycle/gate.py): exit
    code 0, or 1 with the gate's reasons when it stays as it is (`published`: the line of a
    version just published, said either way). Every line goes to `say` (the console's page
    collects them)."""
    from worker.lifecycle.gate import history_gate

    # a missing or corrupt version says so before the gate reads the history
    refused = history_gate(reg, version, reg.load(version), force, say)
    if refused:
        say("\n".join([published, *refused] if published else refused))
        return 1
    reg.promote(version)
    say(f"{published} (current)" if published else f"version {version} is current")
    return 0


def cmd_model_promote(args: argparse.Namespace) -> int:
    return with_registry(args, lambda reg: promoted(reg, args.version, args.force))


def missing_versions(data: list[str] | None) -> str:
    """What to say when `model evaluate` got no version to compare: with --data, that it
    takes every argument after it (the versions named after it among them)."""
    if not data:
        return "name the versions or .npz files to compare: model evaluate 3 4 --from-redis"
    taken = [f for f in data if f.endswith(".npz")]
    hint = f" (--data took {', '.join(taken)})" if taken else ""
    return ("name the versions or files to compare before --data, which takes every argument "
            f"after it: model evaluate 3 4 --data FILE{hint}")  # fmt: skip


def cmd_model_evaluate(args: argparse.Namespace) -> int:
    """`intentstream model evaluate`: see worker/commands/evaluate.py."""
    # model.training.evaluate loads scipy.stats (about a second): for this sub-command only
    from worker.commands.evaluate import run_evaluate, since_ms

    if not args.versions:
        print(f"error: {missing_versions(args.data)}", file=sys.stderr)
        return 2
    cutoff = since_ms(args.since)

    def evaluate(reg: Registry) -> int:
        if args.from_redis:
            partitions = args.partitions or recorded_partitions(reg.r, reg.keys) or 1
            events, _ = read_history(reg.r, reg.prefix, partitions, fields=None)  # every input
        else:
            events = read_event_files(args.data, args.format, args.columns)
        return run_evaluate(args, events, reg, cutoff)

    return with_registry(args, evaluate)


def cmd_model_shadow(args: argparse.Namespace) -> int:
    def shadow(reg: Registry) -> int:
        if args.off:
            reg.set_shadow(None)
            print("no shadow model: workers score with the current version only")
        elif args.version is None:
            print(f"shadow: {reg.shadow() or 'none'}")
        else:
            reg.set_shadow(args.version)
            print(f"version {args.version} is the shadow: workers also score every event with it")
        return 0

    return with_registry(args, shadow)


def cmd_model_rollback(args: argparse.Namespace) -> int:
    def rollback(reg: Registry) -> int:
        print(f"version {reg.rollback()} is current again")
        return 0

    return with_registry(args, rollback)


def cmd_model_export(args: argparse.Namespace) -> int:
    def export(reg: Registry) -> int:
        reg.export(args.version, args.out)
        print(f"wrote version {args.version} to {args.out}")
        return 0

    return with_registry(args, export)
