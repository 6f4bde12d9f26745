"""The one step cost (controller/cost.py) learns a recorded target's step times, at one row and
at sixteen, from the steps a run folds into it, by the rule the controller uses."""
from pathlib import Path

import pytest

from autospec.bench.recorded import replay_batch, trace_prices
from autospec.bench.trace import Trace
from autospec.controller.adaptive import AdaptiveController, ControllerSettings
from autospec.controller.cost import StepCost
from autospec.controller.interface import StaticController
from autospec.controller.learning import Learning

TRACE = Path(__file__).resolve().parents[2] / "configs" / "traces" / "heldout.json"


@pytest.mark.parametrize("rows", [1, 16])
def test_the_step_cost_reproduces_a_recorded_trace_s_step_times(rows):
    """Replay charges each step the trace's recorded costs; a Learning that folds the run's
    step records (plain, two fixed K and the controller's own, so sizes and widths vary)
    prices those same steps within 2 %, the median within 0.5 %."""
    trace = Trace.load(TRACE)
    learning = Learning(16)
    steps = []
    for controller in (StaticController(None, 0), StaticController("ngram", 3),
                       StaticController("ngram", 8), AdaptiveController(ControllerSettings())):
        records, _ = replay_batch(trace, controller, rows, trace.requests[:8])
        for record in records:
            for step in record.step_records:
                learning.fold(step, (), False)
                steps.append(step)
    truth = {b: trace_prices(trace, b) for b in range(1, rows + 1)}
    errors = []
    for step in steps:  # a step's price holds the loop's overhead, the trace's per step
        drafted, widest = step.batch_tokens - step.batch_size, step.batch_width - 1
        predicted = learning.cost.prices(step.batch_size).step(drafted, widest)
        recorded = truth[step.batch_size].step(drafted, widest) + trace.overhead_seconds
        errors.append(abs(predicted / recorded - 1.0))
    errors.sort()
    assert errors[len(errors) // 2] < 0.005, errors[len(errors) // 2]
    assert errors[int(0.95 * len(errors))] < 0.02, errors[int(0.95 * len(errors))]


def test_a_step_cost_state_round_trips():
    cost = StepCost(16)
    for drafted in (0, 8, 0, 24, 0, 3):
        cost.observe(4, 4 + drafted, 0.01 + 0.001 * drafted, width=1 + drafted // 4)
        cost.observe_overhead(0.0002)
    again = StepCost(16).restore(cost.state())
    assert again.plane() == pytest.approx(cost.plane())
    assert again.row_overhead == cost.row_overhead
