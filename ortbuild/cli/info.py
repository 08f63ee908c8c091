"""What ortbuild and this environment know: `targets` (and their execution providers) and `schema`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TypedDict

from ortbuild import files, installed, machine, runtime
from ortbuild.cli.options.info import SchemaOptions, SummaryOptions, TargetsOptions
from ortbuild.errors import OrtbuildError
from ortbuild.gating.reports import summary
from ortbuild.gating.reports.summary import table
from ortbuild.project import capabilities, config, options

PACKAGE_DIR = Path(__file__).resolve().parent.parent  # ortbuild/
SCHEMA_FILE = PACKAGE_DIR / "targets.schema.json"
REFERENCE_FILE = PACKAGE_DIR.parent / "docs" / "targets-reference.md"
TARGETS_DOC = PACKAGE_DIR.parent / "docs" / "targets.md"


class ProviderRow(TypedDict):
    """One row of `ortbuild targets --providers --json`."""
    provider: str
    label: str
    status: str
    runtime: str
    here: bool
    why_not: str | None
    environment: dict[str, str] | None
    built_without_hardware: str
    with_hardware: str
    verified: str


class TargetRow(TypedDict):
    """One row of `ortbuild targets --json`."""
    target: str
    runtime: str
    providers: list[str]
    precisions: list[str]
    models: list[str]
    runtime_here: bool
    providers_here: bool
    why_not: str | None
    description: str


def _providers_here() -> list[ProviderRow]:
    """docs/targets.md's capability table, with this environment's answer for each provider."""
    flavor = installed.installed_flavor()
    out: list[ProviderRow] = []
    for c in capabilities.CAPABILITIES:
        for name in c.providers:
            why = (capabilities.unsupported(name) if c.status == capabilities.UNSUPPORTED
                   else runtime.provider_here(name))
            out.append({"provider": name, "label": c.label, "status": c.status, "runtime": c.runtime,
                        "here": why is None, "why_not": why, "environment": flavor.as_json() if flavor else None,
                        "built_without_hardware": c.portable, "with_hardware": c.with_hardware,
                        "verified": c.verified})
    return out


def _print_providers(rows: list[ProviderRow]) -> None:
    flavor = installed.installed_flavor()
    print(f"execution providers (docs/targets.md), in this environment "
          f"({f'{flavor.distribution} {flavor.version}' if flavor else 'no ONNX Runtime'}, {machine.cpu_model()}):")
    print(table([[r["label"], r["provider"], r["status"], "yes" if r["here"] else "no"] for r in rows],
                ["EP", "provider", "ortbuild support", "runs here"]))
    for r in rows:
        if r["why_not"]:
            print(f"  {r['provider']}: {r['why_not']}")


def cmd_targets(opts: TargetsOptions) -> int:
    if opts.providers:
        rows = _providers_here()
        if opts.json:
            print(json.dumps(rows, indent=2))
        else:
            _print_providers(rows)
        return 0
    project = config.load(opts.config)
    out: list[TargetRow] = []
    for t in project.targets.values():
        why = installed.runtime_problem(t)
        missing: list[str] = []
        if why is None:
            missing = [r for r in (runtime.probe_provider(p, t.plugin_for(p.name)) for p in t.providers) if r]
        out.append({"target": t.name, "runtime": t.runtime_text, "providers": [p.name for p in t.providers],
                    "precisions": sorted({s.precision for s in t.settings.values()}), "models": list(t.models),
                    "runtime_here": why is None, "providers_here": why is None and not missing,
                    "why_not": why or "; ".join(missing) or None, "description": t.description})
    if opts.json:
        print(json.dumps(out, indent=2))
        return 0

    def state(o: TargetRow) -> str:
        if o["providers_here"]:
            return "yes"
        return "other runtime" if not o["runtime_here"] else "no provider (portable build only)"
    print(table([[o["target"], o["runtime"], ",".join(o["precisions"]), str(len(o["models"])), state(o)]
                 for o in out], ["target", "runtime", "precision", "models", "runs here"]))
    for o in out:
        if o["why_not"]:
            print(f"  {o['target']}: {o['why_not']}")
    print()
    _print_providers(_providers_here())
    return 0


def cmd_schema(o: SchemaOptions) -> int:
    generated = {SCHEMA_FILE: options.schema_text(), REFERENCE_FILE: options.reference_markdown()}
    if TARGETS_DOC.exists():  # a source checkout: its capability table is generated too
        generated[TARGETS_DOC] = capabilities.spliced(TARGETS_DOC.read_text())
    if o.write:
        for f, text in generated.items():
            files.atomic_write(f, text.encode(), root=PACKAGE_DIR.parent, mode=0o644)
            print(f"wrote {f}")
        return 0
    if o.check:
        stale = [str(f) for f, text in generated.items() if not f.exists() or f.read_text() != text]
        if stale:
            raise OrtbuildError(f"out of date: {', '.join(stale)}", "run `ortbuild schema --write`")
        print("schema and reference docs are up to date")
        return 0
    sys.stdout.write(options.schema_text())
    return 0


def cmd_summary(o: SummaryOptions) -> int:
    """One table of every target's last build or test results in dist/."""
    return summary.print_summary(o.what, o.config, o.dist)
