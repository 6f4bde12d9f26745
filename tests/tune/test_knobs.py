"""`autospec replay TRACE --knobs`: each audited knob switched off and each constant at other
values, the effect judged against the spread over resampled runs of a shipped trace."""
import json

from click.testing import CliRunner

from autospec.bench.trace import Trace
from autospec.cli import main
from autospec.controller.settings import ControllerSettings
from autospec.tune.knobs import CONSTANTS, NEUTRAL, resample
from conftest import REPO_ROOT

REFERENCE = REPO_ROOT / "configs/traces/reference.json"


def test_every_audited_knob_is_switched_off_and_judged_against_the_resamples(tmp_path):
    out = tmp_path / "knobs.json"
    result = CliRunner().invoke(main, ["replay", str(REFERENCE), "--knobs", "--resamples", "3",
                                       "--json", str(out)])
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())
    constants = [(name, other) for (_, name), others in CONSTANTS.items() for other in others]
    assert [r["name"] for r in rows] == list(NEUTRAL) + [name for name, _ in constants]
    for r in rows[:len(NEUTRAL)]:
        assert r["value"] == getattr(ControllerSettings(), r["name"]) != r["other"]
    for r, (name, other) in zip(rows[len(NEUTRAL):], constants):
        assert r["other"] == other != r["value"]  # the constant is back at its value after
    for r in rows:
        assert r["effect_low"] <= r["effect"] <= r["effect_high"]
        assert r["beyond_noise"] == (r["effect_low"] > 0 or r["effect_high"] < 0)
        assert f"| {r['name']} | {r['value']} | {r['other']} |" in result.output
    # the pooled prior is what lets a request start from its workload's evidence
    assert next(r for r in rows if r["name"] == "prior_strength")["effect"] > 0


def test_a_resample_is_another_run_of_the_same_workload_in_the_traces_order():
    trace = Trace.load(REFERENCE)
    order = {r.id: i for i, r in enumerate(trace.requests)}
    run = resample(trace, 1)
    assert len(run) == len(trace.requests) and len({r.id for r in run}) == len(run)
    drawn = [order[r.id.rsplit("#", 1)[0]] for r in run]
    assert drawn == sorted(drawn) and len(set(drawn)) < len(drawn)  # with replacement
    assert [r.id for r in resample(trace, 1)] == [r.id for r in run] != [r.id for r in resample(trace, 2)]
