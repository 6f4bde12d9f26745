"""How well each model drafter's confidences are calibrated on a recorded trace, out of sample.

    python -m autospec.bench.calibration_check configs/traces/heldout.json

A trace holds, at every output position, each model drafter's K_max proposal's confidences
and how many of its tokens the target kept. Each request is walked as a drafter at K_max
would draft it (from position t, the next draft starts at t + kept + 1), and every draft is
scored by the controller's own rule (Learning.learn: the workload's calibration predicts each
token before it takes it in, then the pooled acceptance takes the draft). The reliability
table (each workload's bins added up, per drafter), its gap (reliability_gap: the
token-weighted mean |predicted - observed| over the confidence bins) and the gap sampling
alone would show (sampling_gap) are what `autospec bench` reports for the drafters the controller drafted with, here for every model drafter
over every position of the trace, whether or not a controller would have chosen it."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from autospec.bench.trace import Trace
from autospec.confidence import merged_table, reliability_gap, sampling_gap
from autospec.controller.learning import Learning
from autospec.telemetry import POOLED


def calibration_gaps(trace: Trace) -> dict[str, dict]:
    """{drafter: {"tokens", "gap", "table"}} for each drafter the trace has confidences of;
    each workload (a request's category) its own calibration, as the controller keeps them."""
    learning = Learning(trace.k_max)
    drafters = sorted({d for r in trace.requests for d in (r.confidence or {})})
    for request in trace.requests:
        for drafter in drafters:
            confidences = (request.confidence or {}).get(drafter)
            if not confidences:
                continue
            t = 0
            while t < len(request.output) - 1:
                proposal = confidences[t]
                if not proposal:
                    t += 1
                    continue
                kept = min(request.match[drafter][t], len(proposal))
                learning.learn(request.category, drafter, len(proposal), kept, proposal)
                t += kept + 1
    out = {}
    for drafter in drafters:
        table = merged_table([per[drafter].reliability() for workload, per in
                              learning.calibration.items() if workload != POOLED and drafter in per])
        out[drafter] = {"tokens": sum(r["tokens"] for r in table),
                        "gap": round(reliability_gap(table) or 0.0, 4),
                        "sampling": round(sampling_gap(table) or 0.0, 4), "table": table}
    return out


def main(argv: list[str]) -> None:
    for path in argv:
        gaps = calibration_gaps(Trace.load(Path(path)))
        print(json.dumps({path: {d: {k: v for k, v in g.items() if k != "table"}
                                 for d, g in gaps.items()}}))


if __name__ == "__main__":
    main(sys.argv[1:])
