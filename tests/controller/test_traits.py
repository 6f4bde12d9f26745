"""The controller knows drafters by what their classes declare, never by name: a third-party
look-up drafter, registered under the `autospec.drafters` entry-point group as a user's package
would be, is peeked before the decision and scored counterfactually after the step like
n-gram."""
import importlib
import sys

import pytest

from autospec.controller.adaptive import AdaptiveController, ControllerSettings
from autospec.controller.interface import PLAIN, Outcome, Step
from autospec.drafters import base
from autospec.drafters.lookups import Lookups
from autospec.telemetry import StepRecord

MODULE = '''
from autospec.drafters.base import Draft, Drafter


class RepeatLast(Drafter):
    """Proposes the context's last token k times: a look-up, no model."""
    peekable = True
    cost_hint = 0.01

    def __init__(self, models=None, **options):
        pass

    def propose(self, ctx, k):
        return Draft([ctx.tokens[-1]] * k)
'''


@pytest.fixture
def third_party(tmp_path, monkeypatch):
    """A package `thirdparty_lookup` installed on sys.path with its entry point, as pip
    would leave it."""
    (tmp_path / "thirdparty_lookup.py").write_text(MODULE)
    info = tmp_path / "thirdparty_lookup-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: thirdparty-lookup\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[autospec.drafters]\nrepeat-last = thirdparty_lookup:RepeatLast\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    monkeypatch.setattr(base, "_entry_points_loaded", False)
    yield "repeat-last"
    base._REGISTRY.pop("repeat-last", None)
    sys.modules.pop("thirdparty_lookup", None)


class Row:
    def __init__(self, tokens):
        self.request_id, self.tokens, self.prompt_len, self.workload = "r", tokens, 3, None
        self.done = False


def test_a_registered_look_up_drafter_is_peeked_and_scored_like_ngram(third_party):
    assert third_party in base.known_drafters()
    controller = AdaptiveController(ControllerSettings(drafters=(third_party, "draft-model")))
    assert controller.peeking == (third_party,) and controller.costly == ("draft-model",)
    row = Row([5, 6, 7, 7, 7])
    asked = []
    lookups = Lookups()

    def peek(r, name, k):
        asked.append(name)
        return lookups.peek(r, name, k)

    assert controller.decide(Step([row], peek)) == [PLAIN]  # the first step measures plain
    assert asked == [third_party]  # peeked all the same; draft-model never is
    estimate = controller._requests["r"].acceptance[third_party]
    before = estimate.observations().sum()
    # the plain step emitted 7: what repeat-last proposed at decide ([7] * 16) is right at
    # position 1, and the only verified position: scored as one proposed, one accepted
    row.tokens.append(7)
    controller.observe(Outcome([StepRecord("r", 0, "none", 0, 0, 0, 1, 0.0, 0.01, 1, 4, 0, 0.0)],
                               [row]))
    assert estimate.observations().sum() == before + 1
