"""Lookups: one component for a host's drafters per row and its controllers' look-ups, shared by
the engine, replay and vLLM's proposer (drafters/lookups.py)."""
from dataclasses import dataclass, field

from autospec.bench.recorded import RecordedEngine
from autospec.bench.trace import Trace
from autospec.drafters.base import Drafter
from autospec.drafters.contract import Draft, _REGISTRY, register
from autospec.drafters.lookups import Lookups
from autospec.engine.loop import Engine

FINISHED: list[tuple[str, int]] = []


@register("test-echo")
class EchoDrafter(Drafter):
    """Proposes the row's last token again; says when its request ends."""
    peekable = True

    def __init__(self, models=None, tag: str = "host"):
        self.tag = tag

    def propose(self, ctx, k):
        return Draft([ctx.tokens[-1]] * k, confidences=[0.5] * k)

    def finish(self, ctx):
        FINISHED.append((self.tag, len(ctx.tokens)))


@dataclass
class Bare:  # a row that keeps no drafters of its own (vLLM's proposer, decide_one)
    request_id: str
    tokens: list[int]
    prompt_len: int = 1


@dataclass
class Keeping(Bare):  # a row that keeps its drafters (the engine's requests)
    drafters: dict = field(default_factory=dict)
    drafter_options: dict | None = None


def test_a_row_keeps_its_drafters_or_the_lookups_keep_them_by_request_until_release():
    FINISHED.clear()
    lookups = Lookups({"test-echo": {"tag": "host"}})
    bare, keeping = Bare("a", [1, 2]), Keeping("b", [3], drafter_options={"test-echo": {"tag": "own"}})
    assert lookups.peek(bare, "test-echo", 2).tokens == [2, 2]
    assert lookups.peek(keeping, "test-echo", 1).tokens == [3]
    assert lookups.drafter(bare, "test-echo") is lookups.drafter(bare, "test-echo")  # made once
    assert keeping.drafters["test-echo"].tag == "own"  # the row's options over the host's
    assert "b" not in lookups._drafters and "a" in lookups._drafters
    assert lookups.take_seconds() >= 0.0 and lookups.take_seconds() == 0.0
    lookups.release(bare)
    lookups.release(keeping)
    assert sorted(FINISHED) == [("host", 2), ("own", 1)]
    assert not lookups._drafters and "test-echo" in keeping.drafters  # a row's go with it


def test_a_model_drafter_is_no_look_up():
    assert Lookups().peek(Bare("a", [1]), "draft-model", 4) is None


def test_the_engine_and_replay_look_up_through_one_lookups(tiny_pair):
    engine = Engine(tiny_pair)
    assert isinstance(engine.lookups, Lookups) and engine.lookups.models is tiny_pair
    engine.drafter_options = {"ngram": {"n_max": 2}}  # a bench's fresh history sets them so
    assert engine.lookups.options == {"ngram": {"n_max": 2}}
    replayed = RecordedEngine(Trace(k_max=4, verify_seconds=[0.01] * 5, requests=[],
                                    draft_seconds_per_token={}), 1)
    assert isinstance(replayed.lookups, Lookups) and replayed.lookups.clock() == replayed.now


def teardown_module():
    _REGISTRY.pop("test-echo", None)
