"""`autospec daemon`: the slow path, as a long-running local service.

    listen.py   where it listens (Unix socket / loopback / remote with a token)
    state.py    what it holds: the store, the policy in force, a Learner per model pair
    app.py      the HTTP API (aiohttp): /v1/telemetry, /v1/params, /v1/reload, /healthz, /metrics
    metrics.py  Prometheus text exposition of the counters and estimates
    service.py  the process: start warm from the store, watch the policy file, flush, signals
    client.py   what a serving process uses: buffered, bounded telemetry and parameter pulls
"""
