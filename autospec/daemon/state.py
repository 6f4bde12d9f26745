"""What the daemon holds: the store, the policy in force, a Learner per (model pair, hardware),
and the counters /metrics exposes (`Counters`, daemon/metrics.py).

Threading: every mutation (ingest, learner updates, flushes, policy reloads) runs on one
worker thread (`DaemonState.worker`), so none of it needs a lock against itself. The event
loop only reads: the policy object and each key's params snapshot are replaced whole (an
atomic assignment), never mutated in place, so GET /v1/params never waits for an ingest.

A fleet: several daemons (`--instance` names each) share one store, PostgreSQL. Ingest is
unchanged and stays one transaction: the requests table's unique (batch id, request id) makes
a batch count once fleet-wide — a re-send to another daemon stores nothing, so that daemon
does not learn from it either. Each daemon's Learner learns from what it ingested and every
flush writes its own rows (estimates keyed by instance too: no daemon overwrites another's),
then reads the other instances' rows; what GET /v1/params serves is its own learner merged
with those (learner.fleet_estimates: evidence adds up). Why not rebuild every learner from
the stored requests instead: the store keeps per (drafter, k) sums, not the steps the
estimates learn from, and autoincrement ids do not arrive in commit order on PostgreSQL, so
"every request since my last read" could skip one. A lone daemon (no other instance's rows)
serves its learner as it is.
"""
from __future__ import annotations

import json
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from prometheus_client import CollectorRegistry

from autospec.daemon.learner import Learner, fleet_step_cost, fleet_estimates
from autospec.daemon.metrics import Counters, StateCollector
from autospec.daemon.outputs import OutputLog
from autospec.policy import Policy, PolicyError, load_policy, parameters_to_dict, parse_policy
from autospec.store import Store
from autospec.metrics import StepSeries
from autospec.telemetry import UNLABELLED, RequestRecord

log = logging.getLogger("autospec.daemon")

DEFAULT_POLICY_TEXT = "schema_version: 1\n"  # the code's defaults, when no file is given


class DaemonState:
    def __init__(self, store: Store, policy_path: Path | None, instance: str = ""):
        self.store = store
        self.policy_path = policy_path
        self.instance = instance  # this daemon's name in a fleet; "" = a lone daemon
        self.policy: Policy = parse_policy(DEFAULT_POLICY_TEXT, "(built-in defaults)")
        self._policy_stamp: tuple | None = None
        self.learners: dict[tuple[str, str], Learner] = {}
        self.snapshots: dict[tuple[str, str], dict] = {}  # replaced whole, read by the loop
        # the other instances' persisted rows per key, as of the last flush: (estimates, batch)
        self.fleet: dict[tuple[str, str], tuple[list[dict], list[dict]]] = {}
        self.dirty: set[tuple[str, str]] = set()
        self.counters = Counters()
        self.registry = CollectorRegistry()  # GET /metrics (daemon/metrics.py)
        self.registry.register(StateCollector(self))
        self.chosen = StepSeries(self.registry, "autospec_", ("model_pair", "workload"))
        self.outputs = OutputLog()  # the event loop's (see outputs.py)
        self.started = time.time()
        # one thread for every mutation (see the module docstring); SQLite has one writer anyway
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="autospec-store")

    # -- policy ----------------------------------------------------------------------------
    def load_initial_policy(self) -> None:
        """At start an invalid policy file is fatal (PolicyError): there is no last good one."""
        if self.policy_path is not None:
            self._put_in_force(load_policy(self.policy_path))
        else:
            self.store.record_policy(self.policy.policy_hash, self.policy.path or "",
                                     self.policy.schema_version)

    def reload_policy(self) -> tuple[bool, str]:
        """Re-read the policy file. An invalid file is logged and the last good policy stays."""
        if self.policy_path is None:
            return True, "no policy file: built-in defaults in force"
        try:
            policy = load_policy(self.policy_path)
        except PolicyError as exc:
            self.counters.reloads["invalid"] += 1
            self._policy_stamp = _stamp(self.policy_path)  # do not re-report every poll
            log.error("policy reload refused; last good policy stays in force",
                      extra={"fields": {"error": str(exc), "policy_hash": self.policy.policy_hash}})
            return False, str(exc)
        changed = policy.policy_hash != self.policy.policy_hash
        self._put_in_force(policy)
        self.counters.reloads["changed" if changed else "unchanged"] += 1
        return True, f"policy {policy.policy_hash[:12]} in force" + ("" if changed else " (unchanged)")

    def policy_file_changed(self) -> bool:
        return self.policy_path is not None and _stamp(self.policy_path) != self._policy_stamp

    def _put_in_force(self, policy: Policy) -> None:
        previous = self.policy
        self._policy_stamp = _stamp(self.policy_path)
        self.policy = policy
        if policy.policy_hash != previous.policy_hash or previous.path is None:
            self.store.record_policy(policy.policy_hash, policy.path or "", policy.schema_version)
            log.info("policy in force", extra={"fields": {"policy_hash": policy.policy_hash,
                                                          "path": policy.path}})

    # -- learning --------------------------------------------------------------------------
    def learner(self, key: tuple[str, str]) -> Learner:
        """The key's Learner; the first use loads what the store persisted (a warm start)."""
        learner = self.learners.get(key)
        if learner is None:
            learner = Learner(k_max=self._k_max()).restore(
                self.store.load_estimates(*key, self.instance))
            batch = self.store.load_batch_cost(*key, self.instance)
            if batch:
                learner.cost.restore(batch)
            self.learners[key] = learner
            self._read_fleet(key)
            if learner.acceptance:
                log.info("warm start from the store", extra={"fields": {
                    "model_pair": key[0], "hardware": key[1],
                    "workloads": sorted(learner.acceptance)}})
        return learner

    def _k_max(self) -> int:
        ks = [self.policy.parameters.k_max] + [p.k_max for p in self.policy.workloads.values()]
        return max(ks)

    def ingest(self, batch_id: str, model_pair: str, hardware: str,
               records: list[RequestRecord], peak_gbs: float | None) -> int:
        """Worker thread. Commit the batch, then learn from it; returns records newly stored.
        The reply (and so the acknowledgement) is sent only after the commit."""
        key = (model_pair, hardware)
        learner = self.learner(key)
        stored = self.store.ingest(records, batch_id, model_pair, hardware)
        self.counters.batches["stored" if stored else "duplicate"] += 1
        if stored == 0:  # a re-send of a committed batch: learnt from already
            return 0
        c = self.counters
        for r in records:
            learner.observe(r)
            workload = r.workload or UNLABELLED
            c.requests[(model_pair, workload)] += 1
            c.output_tokens[(model_pair, workload)] += r.output_tokens
            c.proposed[(model_pair, workload)] += r.proposed
            c.accepted[(model_pair, workload)] += r.accepted
            c.step_records += len(r.step_records)
            self.chosen.observe(r.step_records, model_pair=model_pair, workload=workload)
            for drafter, share in r.drafter_shares.items():
                c.steps[(model_pair, workload, drafter)] += share * r.steps
        seconds = sum(r.bytes_moved / r.bandwidth_gbs for r in records if r.bandwidth_gbs) / 1e9
        if peak_gbs and seconds > 0:  # pooled, as `autospec report`'s util: bytes / seconds
            c.bandwidth_utilisation[model_pair] = (
                sum(r.bytes_moved for r in records) / seconds / 1e9 / peak_gbs)
        self._publish(key)
        self.dirty.add(key)
        return stored

    def flush(self) -> int:
        """Worker thread. Persist the estimates of every key that learnt something, then
        re-read what the rest of the fleet persisted for every key."""
        written = 0
        for key in sorted(self.dirty):
            learner = self.learners[key]
            written += self.store.save_estimates(*key, learner.estimates(), self.instance)
            if learner.cost.observed:
                self.store.save_batch_cost(*key, learner.cost.state(), self.instance)
        self.dirty.clear()
        for key in sorted(self.learners):
            self._read_fleet(key)
        return written

    def _read_fleet(self, key: tuple[str, str]) -> None:
        """Worker thread. The other instances' rows for a key, then a fresh snapshot."""
        estimates, batch_costs = self.store.fleet(*key)
        self.fleet[key] = ([e for i, e in estimates.items() if i != self.instance],
                           [b for i, b in batch_costs.items() if i != self.instance])
        self._publish(key)

    def _publish(self, key: tuple[str, str]) -> None:
        """Worker thread. The key's snapshot for GET /v1/params: this daemon's learner, merged
        with the fleet's rows when there are any (module docstring)."""
        learner = self.learners[key]
        estimates, batch_costs = self.fleet.get(key, ([], []))
        if estimates or batch_costs:
            merged = Learner(k_max=learner.k_max).restore(
                fleet_estimates([learner.by_workload(), *estimates]))
            batch = fleet_step_cost([learner.cost.state(), *batch_costs])
            if batch:
                merged.cost.restore(batch)
            learner = merged
        self.snapshots[key] = learner.snapshot()

    def params(self, model_pair: str, hardware: str, workload: str | None) -> dict:
        """Event loop. The parameters for one (pair, hardware, workload) and what is learnt."""
        key = (model_pair, hardware)
        snapshot = self.snapshots.get(key)
        if snapshot is None:  # first time this key is asked for: load it (rare, once)
            self.worker.submit(self.learner, key).result()
            snapshot = self.snapshots[key]
        policy = self.policy
        self.counters.params_requests += 1
        return {"policy": {"hash": policy.policy_hash, "path": policy.path,
                           "schema_version": policy.schema_version,
                           "provenance": policy.provenance.to_dict()},
                "workload": workload,
                "parameters": parameters_to_dict(policy.resolve(workload)),
                "workloads": {w: parameters_to_dict(p) for w, p in policy.workloads.items()},
                "estimates": snapshot}

    def health(self) -> dict:
        return {"status": "ok", "store": self.store.url, "policy_hash": self.policy.policy_hash,
                "policy_path": self.policy.path, "uptime_s": round(time.time() - self.started, 3),
                "pid": os.getpid()}


def _stamp(path: Path | None) -> tuple | None:
    try:
        st = os.stat(path)
    except (OSError, TypeError):
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def dumps(payload: dict) -> str:
    return json.dumps(payload, separators=(",", ":"))
