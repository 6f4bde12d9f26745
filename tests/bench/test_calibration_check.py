"""python -m autospec.bench.calibration_check: every model drafter of a shipped trace scored
out of sample by the controller's own calibration rule."""
from pathlib import Path

from autospec.bench.calibration_check import calibration_gaps
from autospec.bench.trace import Trace
from conftest import REPO_ROOT


def test_each_model_drafter_of_the_held_out_trace_gets_a_reliability_table():
    trace = Trace.load(Path(REPO_ROOT / "configs" / "traces" / "heldout.json"))
    gaps = calibration_gaps(trace)
    assert {"draft-model", "early-exit"} <= set(gaps)
    for drafter, result in gaps.items():
        table = result["table"]
        assert result["tokens"] == sum(row["tokens"] for row in table) > 100, drafter
        assert all(0.0 <= row["predicted"] <= 1.0 and 0.0 <= row["observed"] <= 1.0
                   for row in table)
        # the gap is the token-weighted mean over the table's bins
        gap = sum(r["tokens"] * abs(r["predicted"] - r["observed"]) for r in table) / result["tokens"]
        assert abs(result["gap"] - gap) < 1e-3
