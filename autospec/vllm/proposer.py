"""vLLM's `custom_class` proposer, hosting autospec's controller (the one the engine runs).

vLLM's contract (0.32, `vllm/v1/spec_decode/custom_class_proposer.py` and the model runner):
the class is built as `Proposer(vllm_config)` in the worker process, the CPU runner calls
`load_model(model)`, and after every step `propose(sampled_token_ids, num_tokens_no_spec,
token_ids_cpu, slot_mappings=...)` returns one draft per row of the runner's input batch,
each 0 to `num_speculative_tokens` long. A row's `sampled_token_ids` are what the target kept
at the step just run: the accepted drafts and one more token (empty while it prefills).

What vLLM does not hand a proposer, and this one needs, are the rows' request ids (state is
per request, and rows are reused), the requests that ended, and the step's scheduled tokens.
The first `Proposer` built wraps the runner's `propose_draft_token_ids` (the method that
calls `propose`) so that it first hands the proposer its input batch and scheduler output
(`begin`). That is the one place autospec touches vLLM's code.

Each step, over the rows that decode:
1. the previous step's outcome per row: its drafter, K, proposed, and accepted =
   len(sampled) - 1; the step's seconds = the time between this call and the last one's end
   (scheduler, forward, sampling: the step the decision bought), at its rows and tokens;
2. `Controller.observe` with those records, then `Controller.decide` over the rows, with
   the look-up drafters (n-gram, suffix, any registered `peekable` one) run here on each
   request's tokens; the decided drafter's proposal, cut to K and to the limit, is the draft.
Finished or aborted requests (the scheduler's `finished_req_ids`) release their state and
send their telemetry to the daemon (daemon_link.py) off the step's path.
"""
from __future__ import annotations

import atexit
import dataclasses
import json
import logging
import os
import time
from dataclasses import dataclass, field

from autospec.controller.adaptive import AdaptiveController
from autospec.controller.interface import Outcome, Step
from autospec.controller.settings import ControllerSettings
from autospec.drafters.base import Draft, create_drafter, drafter_class, known_drafters
from autospec.drafters.lookups import Lookups, lookup_drafters
from autospec.telemetry import StepRecord, summarise

log = logging.getLogger("vllm.autospec")  # under vLLM's logger: its handlers and format
STATS_EVERY = 30.0  # seconds between the proposer's log lines


class ProposerConfigError(ValueError):
    """A start-up setting that cannot be used; the message names the field."""


@dataclass
class ProposerStats:
    steps: int = 0
    step_seconds: float = 0.0  # vLLM's steps, between proposals
    proposer_seconds: float = 0.0  # inside propose: look-ups, decide, observe
    drafted: int = 0
    accepted: int = 0
    requests: int = 0  # finished, telemetry handed to the link
    cut: int = 0  # proposals cut to num_speculative_tokens

    @property
    def overhead(self) -> float:
        """The proposer's seconds over vLLM's step seconds."""
        return self.proposer_seconds / self.step_seconds if self.step_seconds else 0.0


@dataclass
class _Row:
    """A request as the controller reads it (controller/interface.py's Row)."""
    request_id: str
    tokens: list[int]
    prompt_len: int
    workload: str | None
    started: float
    done: bool = False
    steps: list[StepRecord] = field(default_factory=list)
    # the decision in flight: (drafter or None, k, tokens proposed, draft seconds, context,
    # the proposed tokens' confidences)
    pending: tuple | None = None
    # what ends it (its sampling parameters): vLLM's scheduler stops it at max_tokens or at a
    # stop token once it has min_tokens
    max_tokens: int | None = None
    min_tokens: int = 0
    stops: frozenset = frozenset()

    def ends(self, sampled: list[int]) -> bool:
        """Whether the step just verified ended the request (sampled: the tokens it kept)."""
        output = len(self.tokens) - self.prompt_len
        if self.max_tokens is not None and output >= self.max_tokens:
            return True
        return output >= self.min_tokens and not self.stops.isdisjoint(sampled)


def settings_from_env(k_limit: int) -> tuple[ControllerSettings, str | None]:
    """The controller's settings: AUTOSPEC_POLICY's file, else the defaults, with K capped at
    vLLM's num_speculative_tokens and the drafters cut to look-up ones (no model forward runs
    in the proposer). (settings, the policy's path or None)."""
    path = os.environ.get("AUTOSPEC_POLICY") or None
    settings = ControllerSettings()
    if path:
        from autospec.policy import load_policy
        settings = load_policy(path).parameters  # a PolicyError names the file and field
    return fit(settings, k_limit), path


def drafter_options_from_env() -> dict[str, dict]:
    """AUTOSPEC_DRAFTER_OPTIONS: the drafters' options as our engine takes them (its
    drafter_options, bench's --drafter-option), a JSON object {drafter: {option: value}};
    unset: none. Each look-up drafter's are checked by building one with them; a model
    drafter's are unused (it does not run here). A ProposerConfigError names the bad entry."""
    raw = os.environ.get("AUTOSPEC_DRAFTER_OPTIONS") or "{}"
    try:
        options = json.loads(raw)
    except ValueError:
        options = None
    if not isinstance(options, dict) or not all(isinstance(v, dict) for v in options.values()):
        raise ProposerConfigError('AUTOSPEC_DRAFTER_OPTIONS: expected a JSON object {drafter: '
                                  '{option: value}}, e.g. {"suffix": {"min_confidence": 0}}, '
                                  f'got {raw!r}')
    for name, given in options.items():
        try:
            if drafter_class(name).peekable:
                create_drafter(name, None, **given)
        except (TypeError, ValueError) as exc:
            raise ProposerConfigError(f"AUTOSPEC_DRAFTER_OPTIONS.{name}: {exc}") from None
    return options


def fit(settings: ControllerSettings, k_limit: int) -> ControllerSettings:
    drafters = lookup_drafters(settings.drafters) or ("ngram",)
    k_max = min(settings.k_max, k_limit)
    return dataclasses.replace(settings, drafters=drafters, k_max=k_max,
                               k_min=min(settings.k_min, k_max))


class Proposer:
    """vLLM's custom_class proposer: `"model": "autospec.vllm.Proposer"`."""

    def __init__(self, vllm_config):
        spec = vllm_config.speculative_config
        k_limit = spec.num_speculative_tokens
        if not isinstance(k_limit, int) or k_limit < 1:
            raise ProposerConfigError(f"speculative_config.num_speculative_tokens: autospec "
                                      f"needs an integer >= 1 (its K limit), got {k_limit!r}")
        self.k_limit = k_limit
        self.max_model_len = vllm_config.model_config.max_model_len
        self.settings, self.policy_path = settings_from_env(k_limit)
        self.workload = os.environ.get("AUTOSPEC_WORKLOAD") or None
        self.controller = self._controller(self.settings)
        self.lookups = Lookups(drafter_options_from_env())
        self.rows: dict[str, _Row] = {}
        self.stats = ProposerStats()
        self._batch: tuple[list[str], object, int] | None = None  # begin's (ids, prompts, tokens)
        self._requests: dict = {}
        self._looked: dict[tuple[str, str], Draft] = {}
        self._last_end: float | None = None
        self._last_rows = self._last_width = 0
        self._logged = time.perf_counter()
        self.link = None
        url = os.environ.get("AUTOSPEC_DAEMON") or None
        if url:
            from autospec.engine.bandwidth import hardware_key
            from autospec.models.pair import pair_key
            from autospec.vllm.daemon_link import DaemonLink
            self.link = DaemonLink(url, pair_key(str(vllm_config.model_config.model), None),
                                   hardware_key())
            atexit.register(self.link.close)
        _wrap_runner()
        log.info("autospec proposer: drafters %s (options %s), K <= %d, policy %s, daemon %s",
                 ",".join(self.settings.drafters), self.lookups.options or "none",
                 self.settings.k_max, self.policy_path or "defaults", url or "none")

    @staticmethod
    def _controller(settings: ControllerSettings) -> AdaptiveController:
        controller = AdaptiveController(settings)
        controller.bind(lookup_drafters(tuple(known_drafters())))
        return controller

    def load_model(self, *args, **kwargs) -> None:
        """vLLM's CPU runner calls it with the target: the look-up drafters need no model."""

    # -- the step ----------------------------------------------------------------------------
    def begin(self, runner, scheduler_output) -> None:
        """The runner, before `propose` (see _wrap_runner): the rows' request ids, prompt
        lengths, the step's scheduled tokens, and the requests that ended since the last."""
        batch = runner.input_batch
        self._batch = (list(batch.req_ids), batch.num_prompt_tokens,
                       int(scheduler_output.total_num_scheduled_tokens))
        self._requests = runner.requests  # request id -> vLLM's state (its sampling params)
        for request_id in scheduler_output.finished_req_ids:
            self.finish(request_id)

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, **_) -> list[list[int]]:
        t0 = time.perf_counter()
        rows = len(sampled_token_ids)
        if self._batch is None or len(self._batch[0]) < rows:  # begin was not called
            return [[] for _ in range(rows)]
        ids, prompt_lens, scheduled = self._batch
        self._batch = None
        step_seconds = None if self._last_end is None else t0 - self._last_end
        self._apply_params()
        out: list[list[int]] = [[] for _ in range(rows)]
        deciding: list[tuple[int, _Row]] = []
        records, recorded = [], []
        for i, sampled in enumerate(sampled_token_ids):
            request_id, n = ids[i], int(num_tokens_no_spec[i])
            row = self.rows.get(request_id)
            if not sampled:  # still prefilling
                if row is not None:
                    row.pending = None
                continue
            if row is None:
                row = self.rows[request_id] = self._row(request_id, token_ids_cpu[i, :n].tolist(),
                                                        int(prompt_lens[i]), t0)
            else:
                record = self._record(row, sampled, step_seconds, scheduled)
                if record is not None:
                    records.append(record)
                    recorded.append(row)
                row.tokens.extend(sampled)
                if len(row.tokens) != n:  # out of step with vLLM's view: take its tokens
                    row.tokens = token_ids_cpu[i, :n].tolist()
            row.pending = None
            if row.ends(sampled):
                # the scheduler stops it after this step (and says so only at the next one, if
                # any): its telemetry goes now
                self.finish(request_id)
            elif n < self.max_model_len - 1:
                deciding.append((i, row))
        if records:
            self.controller.observe(Outcome(records, recorded))
        if deciding:
            decisions = self.controller.decide(Step([row for _, row in deciding], self._peek))
            share = self.lookups.take_seconds() / len(deciding)
            for (i, row), (drafter, k, _) in zip(deciding, decisions):
                room = self.max_model_len - len(row.tokens) - 1
                k = max(0, min(k, self.k_limit, room))
                tokens: list[int] = []
                confidences = None
                if drafter is not None and k:
                    draft = self._looked.get((row.request_id, drafter)) or self._peek(row, drafter, k)
                    if draft is not None:
                        # the proposal trimmed to K: the decision's over each token's calibrated
                        # confidence (the tokens that pay at this step's goodput)
                        tokens = list(draft.tokens[:k])
                        if draft.confidences is not None and tokens:
                            confidences = list(draft.confidences[:len(tokens)])
                        self.stats.cut += len(draft.tokens) > self.k_limit
                out[i] = tokens
                row.pending = (drafter, k, len(tokens), share, len(row.tokens) - 1, confidences)
        self._looked.clear()
        end = time.perf_counter()
        self._last_end, self._last_rows = end, rows
        self._last_width = 1 + max((len(o) for o in out), default=0)
        stats = self.stats
        stats.steps += 1
        stats.proposer_seconds += end - t0
        if step_seconds is not None:
            stats.step_seconds += step_seconds
        if end - self._logged > STATS_EVERY:
            self._log()
        return out

    def _row(self, request_id: str, tokens: list[int], prompt_len: int, now: float) -> _Row:
        params = getattr(self._requests.get(request_id), "sampling_params", None)
        if params is None:  # a pooling request, say: no stop to foresee
            return _Row(request_id, tokens, prompt_len, self.workload, now)
        return _Row(request_id, tokens, prompt_len, self.workload, now,
                    max_tokens=params.max_tokens or self.max_model_len,
                    min_tokens=params.min_tokens, stops=frozenset(params.all_stop_token_ids))

    def _peek(self, row: _Row, name: str, k: int) -> Draft | None:
        draft = self.lookups.peek(row, name, k)
        if draft is not None:
            self._looked[row.request_id, name] = draft
        return draft

    def _record(self, row: _Row, sampled: list[int], step_seconds: float | None,
                scheduled: int) -> StepRecord | None:
        """The outcome of the row's decision in flight, now that vLLM verified it."""
        if row.pending is None or step_seconds is None:
            return None
        drafter, k, proposed, draft_seconds, context, confidences = row.pending
        accepted = min(len(sampled) - 1, proposed)
        self.stats.drafted += proposed
        self.stats.accepted += accepted
        record = StepRecord(row.request_id, len(row.steps), drafter or "none", k if proposed else 0,
                            proposed, accepted, len(sampled), draft_seconds, step_seconds,
                            proposed + 1, context, 0, 0.0, batch_size=self._last_rows,
                            batch_tokens=max(scheduled, self._last_rows),
                            batch_width=self._last_width, confidences=confidences)
        row.steps.append(record)
        return record

    def finish(self, request_id: str) -> None:
        """The request has ended (finished or aborted): its state goes, its telemetry is sent."""
        row = self.rows.pop(request_id, None)
        if row is None:
            return
        row.done = True
        self.controller.release(row)
        self.lookups.release(row)
        self.stats.requests += 1
        if self.link is not None and row.steps:
            self.link.submit(summarise(row.request_id, row.prompt_len, row.steps,
                                       time.perf_counter() - row.started, row.workload,
                                       "stop", "adaptive"))

    # -- the daemon ----------------------------------------------------------------------------
    def _apply_params(self) -> None:
        """Between steps: the daemon's newest parameters, if any arrived. A policy in force
        there replaces the settings (unless AUTOSPEC_POLICY names a file here); its learnt
        estimates warm the controller where they hold more evidence than it has."""
        params = self.link.take_params() if self.link is not None else None
        if params is None:
            return
        if self.policy_path is None and params.get("parameters"):
            from autospec.policy import parameters_from_dict
            settings = fit(parameters_from_dict(params["parameters"]), self.k_limit)
            if settings != self.settings and not self.rows:
                self.settings, self.controller = settings, self._controller(settings)
        self.controller.warm_start(params.get("estimates") or {})

    def _log(self) -> None:
        s, link = self.stats, self.link
        sent = f", telemetry acknowledged {link.stats.acknowledged_records}, unsent " \
               f"{link.client.unacknowledged}, dropped {link.stats.dropped_records}" if link else ""
        log.info("autospec: %d steps, drafted %d, accepted %d, proposer %.2f%% of step time, "
                 "%d requests%s", s.steps, s.drafted, s.accepted, 100 * s.overhead, s.requests, sent)
        self._logged = time.perf_counter()


def _wrap_runner() -> None:
    """Make vLLM's model runner hand its input batch and scheduler output to an autospec
    Proposer before it asks for drafts (once per process)."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    original = GPUModelRunner.propose_draft_token_ids
    if getattr(original, "_autospec", False):
        return

    def propose_draft_token_ids(self, scheduler_output, *args, **kwargs):
        if isinstance(self.drafter, Proposer):
            self.drafter.begin(self, scheduler_output)
        return original(self, scheduler_output, *args, **kwargs)

    propose_draft_token_ids._autospec = True
    GPUModelRunner.propose_draft_token_ids = propose_draft_token_ids
