"""autospec inside vLLM: the controller picks drafter and K per request and per step in
`vllm serve` / `vllm.LLM`, with `autospec daemon` beside it.

    vllm serve MODEL --speculative-config \\
        '{"method": "custom_class", "model": "autospec.vllm.Proposer", "num_speculative_tokens": 8}'

`proposer.py` is the proposer vLLM loads (its `custom_class` contract); `daemon_link.py` its
link to the daemon (telemetry out, estimates and policy in, on a thread of its own);
`export.py` writes a pair's feature head as a vLLM EAGLE checkpoint (`autospec models export`);
`bench.py` runs `autospec bench --engine vllm`. Nothing here imports vLLM at import time:
autospec installs and runs without it. Settings come from the environment of the process
that runs vLLM:

    AUTOSPEC_DAEMON   the daemon (unix:PATH or http://HOST:PORT); unset: learn locally only
    AUTOSPEC_POLICY   a policy file (autospec policy validate); unset: the daemon's, else defaults
    AUTOSPEC_WORKLOAD the workload label its requests' telemetry carries (default: vllm)
    AUTOSPEC_DRAFTER_OPTIONS  the look-up drafters' options, JSON {drafter: {option: value}}
                      (our engine's drafter_options); unset: their defaults
"""
from autospec.vllm.proposer import Proposer

__all__ = ["Proposer"]
