"""The `autospec` command: a click group, one module per command."""
from __future__ import annotations

import click

from autospec.cli.bench import bench
from autospec.cli.daemon import daemon
from autospec.cli.demo import demo
from autospec.cli.generate import generate
from autospec.cli.models import models
from autospec.cli.policy import policy
from autospec.cli.replay import replay
from autospec.cli.tune import tune
from autospec.cli.report import report
from autospec.cli.serve import serve


@click.group(context_settings={"auto_envvar_prefix": "AUTOSPEC", "help_option_names": ["-h", "--help"]})
def main() -> None:
    """Speculative decoding that tunes itself."""


main.add_command(models)
main.add_command(generate)
main.add_command(bench)
main.add_command(replay)
main.add_command(policy)
main.add_command(tune)
main.add_command(report)
main.add_command(daemon)
main.add_command(serve)
main.add_command(demo)
