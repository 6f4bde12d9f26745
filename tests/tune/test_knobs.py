"""`autospec replay TRACE --knobs`: each audited knob switched off, its effect against the
seeds' spread, on a shipped trace."""
import json

from click.testing import CliRunner

from autospec.cli import main
from autospec.controller.settings import ControllerSettings
from autospec.tune.knobs import NEUTRAL
from conftest import REPO_ROOT


def test_every_audited_knob_is_switched_off_and_judged_against_the_seeds_spread(tmp_path):
    out = tmp_path / "knobs.json"
    result = CliRunner().invoke(main, ["replay", str(REPO_ROOT / "configs/traces/reference.json"),
                                       "--knobs", "--seeds", "2", "--json", str(out)])
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())
    assert [r["knob"] for r in rows] == list(NEUTRAL)
    for r in rows:
        assert r["default"] == getattr(ControllerSettings(), r["knob"]) != r["neutral"]
        assert r["exceeds_spread"] == (abs(r["effect"]) > r["spread"])
        assert f"| {r['knob']} |" in result.output
    # the pooled prior is what lets a request start from its workload's evidence
    assert next(r for r in rows if r["knob"] == "prior_strength")["effect"] > 0
