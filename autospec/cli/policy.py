"""`autospec policy validate|show|diff`: check and compare policy files."""
from __future__ import annotations

import json
from pathlib import Path

import click

_file = click.Path(path_type=Path, dir_okay=False)


@click.group()
def policy() -> None:
    """Validate, show and compare policy files (policies/*.yaml)."""


@policy.command()
@click.argument("files", nargs=-1, required=True, type=_file)
def validate(files: tuple[Path, ...]) -> None:
    """One line per FILE: `FILE: ok (hash)` or its error. Exit 1 if any is invalid."""
    from autospec.policy import PolicyError, load_policy
    failed = 0
    for path in files:
        try:
            loaded = load_policy(path)
        except PolicyError as exc:
            failed += 1
            click.echo(str(exc))
            continue
        click.echo(f"{path}: ok ({loaded.policy_hash[:12]})")
    if failed:
        raise SystemExit(1)


@policy.command()
@click.argument("file", type=_file)
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of YAML.")
def show(file: Path, as_json: bool) -> None:
    """The resolved parameters: defaults filled in, and every workload with its overrides
    applied, plus the policy hash and provenance."""
    import yaml

    from autospec.policy import PolicyError, load_policy, parameters_to_dict
    try:
        loaded = load_policy(file)
    except PolicyError as exc:
        raise click.ClickException(str(exc)) from None
    resolved = {
        "file": str(file),
        "policy_hash": loaded.policy_hash,
        "schema_version": loaded.schema_version,
        "parameters": parameters_to_dict(loaded.parameters),
        "workloads": {w: parameters_to_dict(p) for w, p in sorted(loaded.workloads.items())},
        "provenance": loaded.provenance.to_dict(),
    }
    if as_json:
        click.echo(json.dumps(resolved, indent=2))
    else:
        click.echo(yaml.safe_dump(resolved, sort_keys=False, default_flow_style=None).rstrip())


@policy.command()
@click.argument("a", type=_file)
@click.argument("b", type=_file)
def diff(a: Path, b: Path) -> None:
    """Fields that differ from A to B, one per line: `FIELD: A_VALUE -> B_VALUE`.
    Prints nothing when the two are the same (policy hashes are then equal too)."""
    from autospec.policy import PolicyError, diff_policies, load_policy
    try:
        first, second = load_policy(a), load_policy(b)
    except PolicyError as exc:
        raise click.ClickException(str(exc)) from None
    for line in diff_policies(first, second):
        click.echo(line)
