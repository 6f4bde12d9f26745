"""autospec's proposer inside the real vLLM (its CPU build), on the shipped reference pair,
with a real `autospec daemon` beside it: one vLLM engine with the proposer for the module (a
plain one first, for the outputs to match, then freed).

vLLM runs its engine in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0) so the tests can read
the proposer it built: what it decided, what it released, what it sent."""
import copy
import gc
import json
import os
import re
from types import SimpleNamespace

import pytest

vllm = pytest.importorskip("vllm", reason="vLLM's CPU build (pip install -e '.[vllm]')")

from autospec.paths import REFERENCE_DIR  # noqa: E402
from autospec.vllm.proposer import Proposer, ProposerConfigError, _Row  # noqa: E402

from conftest import NEAR_TIE, divergences  # noqa: E402
from processes import request, start_daemon, wait_for  # noqa: E402

K = 8
PROMPTS = [
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n",
    "import os\n\ndef main():\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
    "for i in range(10):\n    print(i)\n",
    "def fib(n):\n    if n < 2:\n        return n\n",
    "import json\n\ndef load(path):\n    with open(path) as f:\n",
]
SPEC = {"method": "custom_class", "model": "autospec.vllm.Proposer", "num_speculative_tokens": K}


def engine(speculative_config=None):
    return vllm.LLM(str(REFERENCE_DIR / "target"), dtype="float32", enforce_eager=True,
                    kv_cache_memory_bytes=256 << 20, max_model_len=1024, max_num_seqs=16,
                    speculative_config=speculative_config, seed=0)


def greedy(llm, prompts, max_tokens=48):
    params = vllm.SamplingParams(temperature=0.0, max_tokens=max_tokens)
    return [list(out.outputs[0].token_ids) for out in llm.generate(prompts, params, use_tqdm=False)]


def assert_near_ties_only(pair, prompts, got, plain):
    """vLLM's speculative outputs are its plain ones, or part from them first at one of plain's
    near-ties (trained weights; margins from autospec's forward of the same target)."""
    for _, _, margin in divergences(pair, prompts, got, plain):
        assert margin < NEAR_TIE, f"diverged from plain at a top-2 margin of {margin:.2e}"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vllm")
    saved = {k: os.environ.get(k) for k in ("VLLM_ENABLE_V1_MULTIPROCESSING", "AUTOSPEC_DAEMON")}
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    state = {"tmp": tmp}
    try:
        plain_llm = engine()
        state["plain"] = greedy(plain_llm, PROMPTS * 2)
        del plain_llm
        gc.collect()
        state["daemon"] = start_daemon(tmp)
        os.environ["AUTOSPEC_DAEMON"] = state["daemon"].url
        state["llm"] = engine(SPEC)
        runner = state["llm"].llm_engine.model_executor.driver_worker.worker.model_runner
        state["proposer"] = runner.drafter
        yield state
    finally:  # the environment as it was, even when an engine failed to start
        if "proposer" in state:
            state["proposer"].link.close()
        if "daemon" in state:
            state["daemon"].stop()  # a test may have restarted it
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def requests_stored(url: str) -> int:
    status, text = request(url, "GET", "/metrics")
    assert status == 200
    return sum(int(float(n)) for n in re.findall(r"^autospec_requests_total\{[^}]*\} (\S+)",
                                                   text, re.M))


def test_greedy_output_is_vllms_plain_output_and_the_controller_drafts(setup, reference_pair):
    proposer = setup["proposer"]
    assert isinstance(proposer, Proposer)
    lengths = []
    propose = proposer.propose

    def watched(*args, **kwargs):
        out = propose(*args, **kwargs)
        lengths.extend(len(draft) for draft in out)
        return out

    proposer.propose = watched
    try:
        assert_near_ties_only(reference_pair, PROMPTS * 2, greedy(setup["llm"], PROMPTS * 2),
                              setup["plain"])
    finally:
        del proposer.propose
    assert max(lengths) <= K  # never a draft longer than num_speculative_tokens
    assert proposer.stats.drafted > 0 and proposer.stats.accepted > 0
    assert len({n for n in lengths if n}) > 1  # K chosen per row and step, not one fixed K
    # every request released: nothing kept per request once it ended
    assert proposer.rows == {} and proposer.controller._requests == {}
    assert proposer.lookups._drafters == {}


def test_every_request_reaches_the_daemon_and_a_new_proposer_starts_warm(setup):
    proposer, url = setup["proposer"], setup["daemon"].url
    before = proposer.stats.requests
    greedy(setup["llm"], PROMPTS)
    assert proposer.stats.requests == before + len(PROMPTS)
    assert wait_for(lambda: requests_stored(url) == proposer.stats.requests, 20)
    # a restarted vLLM: a new proposer pulls the daemon's estimates before its first step
    fresh = Proposer(setup["llm"].llm_engine.vllm_config)
    try:
        assert wait_for(lambda: fresh.link.stats.params_fetched > 0, 10)
        fresh._apply_params()
        prior = fresh.controller.priors
        assert any(e.observations().sum() > 0 for per in prior.values() for e in per.values())
    finally:
        fresh.link.close()


def test_a_killed_daemon_costs_telemetry_only_and_is_caught_up_on_restart(setup, reference_pair):
    proposer, daemon, tmp = setup["proposer"], setup["daemon"], setup["tmp"]
    stored = requests_stored(daemon.url)
    daemon.kill()
    assert_near_ties_only(reference_pair, PROMPTS, greedy(setup["llm"], PROMPTS),
                          setup["plain"][:len(PROMPTS)])  # served all the same
    link = proposer.link
    assert wait_for(lambda: link.client.unacknowledged > 0 and link.stats.failed_sends > 0, 10)
    setup["daemon"] = restarted = start_daemon(tmp)  # the same socket and store
    # every request's telemetry reaches the new process (the new process counts its own): a
    # request's batch may still be on its way to the link when the first re-sent one is
    # acknowledged, so nothing unacknowledged alone is not the end of it
    assert wait_for(lambda: link.client.unacknowledged == 0
                    and requests_stored(restarted.url) == len(PROMPTS), 30)
    assert stored + len(PROMPTS) == proposer.stats.requests


def test_start_up_errors_name_the_field(setup, tmp_path, monkeypatch):
    config = copy.deepcopy(setup["llm"].llm_engine.vllm_config)
    config.speculative_config.num_speculative_tokens = 0
    with pytest.raises(ProposerConfigError, match="num_speculative_tokens"):
        Proposer(config)
    bad = tmp_path / "bad.yaml"
    bad.write_text("schema_version: 1\nk_max: 0\n")
    monkeypatch.setenv("AUTOSPEC_POLICY", str(bad))
    monkeypatch.delenv("AUTOSPEC_DAEMON")
    with pytest.raises(ValueError, match=r"bad\.yaml.*k_max"):
        Proposer(setup["llm"].llm_engine.vllm_config)


def bare_proposer(monkeypatch, options: str) -> Proposer:
    """A Proposer built as vLLM builds one, from a config holding only what it reads, with
    AUTOSPEC_DRAFTER_OPTIONS = `options` (no engine, no daemon)."""
    monkeypatch.delenv("AUTOSPEC_DAEMON", raising=False)
    monkeypatch.delenv("AUTOSPEC_POLICY", raising=False)
    monkeypatch.setenv("AUTOSPEC_DRAFTER_OPTIONS", options)
    return Proposer(SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=K),
                                    model_config=SimpleNamespace(max_model_len=1024)))


def test_drafter_options_reach_the_proposers_look_ups(monkeypatch):
    row = _Row("r", [5, 1, 9, 1], 4, None, 0.0)  # "1" recurs; no 2-gram does
    assert bare_proposer(monkeypatch, "").lookups.peek(row, "ngram", 2).tokens == [9, 1]
    proposer = bare_proposer(monkeypatch, json.dumps({"ngram": {"n_min": 2},
                                                      "suffix": {"min_confidence": 0.5}}))
    assert proposer.lookups.peek(row, "ngram", 2).tokens == []  # 2-grams and up only
    proposer.lookups.peek(row, "suffix", 2)
    assert proposer.lookups._drafters["r"]["suffix"].options.min_confidence == 0.5


@pytest.mark.parametrize("options, message", [
    ("ngram.n_min=2", r"AUTOSPEC_DRAFTER_OPTIONS: expected a JSON object \{drafter: "),
    ('{"ngram": 2}', r"AUTOSPEC_DRAFTER_OPTIONS: expected a JSON object"),
    ('{"ngarm": {}}', r"AUTOSPEC_DRAFTER_OPTIONS\.ngarm: unknown drafter 'ngarm'"),
    ('{"ngram": {"n_mx": 3}}', r"AUTOSPEC_DRAFTER_OPTIONS\.ngram: .*'n_mx'"),
    ('{"ngram": {"n_min": 3, "n_max": 2}}', r"AUTOSPEC_DRAFTER_OPTIONS\.ngram: .*n_min=3"),
    ('{"suffix": {"min_confidence": 2}}', r"AUTOSPEC_DRAFTER_OPTIONS\.suffix: .*min_confidence"),
])
def test_bad_drafter_options_are_refused_naming_the_option(monkeypatch, options, message):
    with pytest.raises(ProposerConfigError, match=message):
        bare_proposer(monkeypatch, options)
