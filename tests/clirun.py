"""Running the CLI in tests through click's CliRunner.

CliRunner catches an unexpected exception and keeps it in `result.exception`; the output shows
no traceback. So `"Traceback" not in result.output` can never fail: a test must look at
`result.exception`, where only a SystemExit (click's own exits, `raise SystemExit(1)`) is an
expected end.
"""
import traceback

import pytest
from click.testing import CliRunner

from autospec.cli import main


def invoke(args, env=None, **kwargs):
    """`autospec ARGS...`; fails the test on any exception but SystemExit."""
    result = CliRunner().invoke(main, [str(a) for a in args], env=env, **kwargs)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        pytest.fail("the command raised instead of exiting:\n"
                    + "".join(traceback.format_exception(result.exception)))
    return result


def error_line(result) -> str:
    """The one `Error: ...` line of a refused command (the test fails unless there is one)."""
    errors = [ln for ln in result.output.splitlines() if ln.startswith("Error:")]
    assert result.exit_code != 0 and len(errors) == 1, result.output
    return errors[0]
