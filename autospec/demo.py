"""`autospec demo`: the whole system on the shipped reference pair, in one command.

Starts `autospec daemon` (Unix socket in a temp dir, the store under the data dir, so what it
learns carries over to the next run) and `autospec serve` on a free loopback port, drives the
shipped mixed workload through /v1/completions (chat rows: /v1/chat/completions) — each
prompt once with the online controller
and once with plain decoding, interleaved, greedy — and ends with what the controller chose
per category and the speedup against plain decoding measured in this run.
"""
from __future__ import annotations

import json
import os
import tempfile
import time
import urllib.error
import urllib.request
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from autospec.process import StartError, spawn

METHODS = ("plain", "adaptive")


class DemoError(RuntimeError):
    pass


@dataclass
class Tally:
    """Per (category, method): tokens, engine seconds, steps by drafter and by K."""
    tokens: int = 0
    seconds: float = 0.0
    client_seconds: float = 0.0
    steps: int = 0
    drafters: dict = field(default_factory=lambda: defaultdict(float))
    ks: dict = field(default_factory=lambda: defaultdict(float))

    def add(self, metrics: dict, client_seconds: float) -> None:
        self.tokens += metrics["output_tokens"]
        self.seconds += metrics["wall_seconds"]
        self.client_seconds += client_seconds
        self.steps += metrics["steps"]
        for name, share in metrics["drafter_shares"].items():
            self.drafters[name] += share * metrics["steps"]
        for k, share in metrics["k_shares"].items():
            self.ks[int(k)] += share * metrics["steps"]

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def complete(url: str, prompt, max_tokens: int, method: str, workload: str) -> tuple[str, dict, float]:
    """(output text, autospec's metrics, client seconds) for one workload row (bench.harness's
    Prompt): a plain prompt through /v1/completions, a chat through /v1/chat/completions."""
    chat = prompt.messages is not None
    body = {"max_tokens": max_tokens, "temperature": 0,
            "autospec": {"method": method, "workload": workload}}
    body.update({"messages": list(prompt.messages)} if chat else {"prompt": prompt.prompt})
    request = urllib.request.Request(f"{url}/v1/{'chat/' if chat else ''}completions",
                                     json.dumps(body).encode(), {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=600) as reply:
            payload = json.loads(reply.read())
    except urllib.error.HTTPError as exc:  # a 400 says why in its body
        raise DemoError(f"prompt '{prompt.id}': the server answered {exc.code}: "
                        f"{exc.read().decode(errors='replace')[:500]}") from None
    choice = payload["choices"][0]
    text = choice["message"]["content"] if chat else choice["text"]
    return text, payload["autospec"], time.perf_counter() - t0


def run_demo(prompts, max_tokens: int, db: str | None, target: str | None, draft: str | None,
             echo=print, progress=None, pair: str | None = None, weights: str | None = None) -> dict:
    """Run everything; returns {category: {method: Tally}} and writes nothing but the store."""
    env = dict(os.environ)
    with tempfile.TemporaryDirectory(prefix="autospec-demo-") as tmp:
        tmp = Path(tmp)
        daemon_args = ["daemon", "--listen", f"unix:{tmp / 'daemon.sock'}"]
        if db:
            daemon_args += ["--db", db]
        serve_args = ["serve", "--port", "0", "--daemon", f"unix:{tmp / 'daemon.sock'}",
                      "--params-interval", "2"]
        for flag, value in (("--pair", pair), ("--target", target), ("--draft", draft),
                            ("--weights", weights)):
            if value:
                serve_args += [flag, value]
        daemon = serve = None
        try:
            try:
                daemon = spawn(daemon_args, tmp / "daemon.log", env, 60, new_session=True)
                serve = spawn(serve_args, tmp / "serve.log", env, 300, new_session=True)
            except StartError as exc:
                raise DemoError(str(exc)) from None
            url = serve.url
            echo(f"daemon on unix:{tmp / 'daemon.sock'}, serve on {url}")
            results: dict = defaultdict(lambda: {m: Tally() for m in METHODS})
            identical = True
            for i, p in enumerate(prompts):
                limit = p.max_new_tokens or max_tokens
                texts = {}
                # alternate which method goes first, so slow drift favours neither
                for method in (METHODS if i % 2 == 0 else METHODS[::-1]):
                    texts[method], metrics, client_s = complete(url, p, limit, method, p.category)
                    results[p.category][method].add(metrics, client_s)
                identical &= texts["plain"] == texts["adaptive"]
                if progress:
                    progress(i + 1, len(prompts), overall(results))
            health = settled_health(url)
        finally:
            if serve is not None:
                serve.stop()
            code = daemon.stop() if daemon is not None else None
        if daemon is not None and code not in (0, None):
            echo(f"warning: the daemon exited with code {code}; log:\n"
                 f"{(tmp / 'daemon.log').read_text()[-1500:]}")
    return {"categories": dict(results), "identical": identical, "serve": health}


def settled_health(url: str, timeout: float = 10.0) -> dict:
    """serve's /healthz once its telemetry buffer has drained (or after `timeout` seconds)."""
    deadline = time.monotonic() + timeout
    while True:
        health = json.loads(urllib.request.urlopen(f"{url}/healthz", timeout=10).read())
        if health["daemon"]["unacknowledged"] == 0 or time.monotonic() > deadline:
            return health
        time.sleep(0.2)


def overall(results: dict) -> float:
    plain = sum(r["plain"].tokens for r in results.values()) / max(
        1e-9, sum(r["plain"].seconds for r in results.values()))
    ours = sum(r["adaptive"].tokens for r in results.values()) / max(
        1e-9, sum(r["adaptive"].seconds for r in results.values()))
    return ours / plain if plain else 0.0


def format_summary(outcome: dict) -> str:
    results = outcome["categories"]
    lines = ["| category | plain tok/s | adaptive tok/s | speedup | drafters chosen (share of "
             "steps) | K chosen (share of steps) |", "|---|---|---|---|---|---|"]
    rows = sorted(results.items())
    total = {m: Tally() for m in METHODS}
    for category, by_method in rows:
        ours, plain = by_method["adaptive"], by_method["plain"]
        for m in METHODS:
            total[m].tokens += by_method[m].tokens
            total[m].seconds += by_method[m].seconds
            total[m].client_seconds += by_method[m].client_seconds
            total[m].steps += by_method[m].steps
            for d, n in by_method[m].drafters.items():
                total[m].drafters[d] += n
            for k, n in by_method[m].ks.items():
                total[m].ks[k] += n
        lines.append(_row(category, plain, ours))
    lines.append(_row("overall", total["plain"], total["adaptive"]))
    client = (total["plain"].client_seconds / total["adaptive"].client_seconds
              if total["adaptive"].client_seconds else 0.0)
    lines += ["", f"greedy outputs identical to plain decoding: "
                  f"{'yes' if outcome['identical'] else 'NO'}",
              f"speedup measured by the client (HTTP round trips included): {client:.2f}x",
              f"telemetry: {outcome['serve']['daemon']['acknowledged_records']} of "
              f"{outcome['serve']['daemon']['submitted']} request records acknowledged by the "
              f"daemon"]
    return "\n".join(lines)


def _row(name: str, plain: Tally, ours: Tally) -> str:
    def shares(counts: dict) -> str:
        n = sum(counts.values()) or 1
        top = sorted(counts.items(), key=lambda kv: -kv[1])[:4]
        return ", ".join(f"{k} {v / n:.0%}" for k, v in top)
    ratio = ours.tokens_per_s / plain.tokens_per_s if plain.tokens_per_s else 0.0
    return (f"| {name} | {plain.tokens_per_s:.1f} | {ours.tokens_per_s:.1f} | {ratio:.2f}x | "
            f"{shares(ours.drafters)} | {shares({f'K={k}': v for k, v in sorted(ours.ks.items())})} |")
