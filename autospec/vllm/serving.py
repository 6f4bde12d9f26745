"""vLLM's OpenAI server with autospec's proposer and `autospec daemon` beside it, driven by the
`openai` SDK: the serving-side figures of docs/vllm.md.

    python -m autospec.vllm.serving [--pair reference] [--prompts FILE] [--clients 16]
                                    [--max-tokens 64] [--passes 1] [--num-speculative-tokens 8]
                                    [--json OUT]

Every phase sends the whole workload with N concurrent clients (greedy) and counts tokens
over its wall time:
1. plain: vLLM's server without speculation, for the outputs every other phase must equal;
2. cold: a fresh daemon (empty store) and a fresh server with the proposer;
3. warm: that server stopped and a fresh one started against the same daemon: it pulls what
   the daemon learnt from phase 2 before its first request (a restarted `vllm serve`);
4. daemon killed: the daemon is killed a second into a pass, the pass finishes, the daemon is
   restarted on the same store, and the buffered telemetry must arrive.
Telemetry is counted in the daemon's store (its SQLite file's request rows).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from autospec.process import spawn

SERVER = [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """vLLM's OpenAI server in a process of its own, up once /v1/models answers."""

    def __init__(self, model: str, log: Path, dtype: str, spec: dict | None, env: dict,
                 timeout: float = 600.0):
        from openai import OpenAI
        self.port = free_port()
        args = [*SERVER, "--model", model, "--port", str(self.port), "--dtype", dtype,
                "--enforce-eager", "--served-model-name", "served",
                "--kv-cache-memory-bytes", str(1 << 30)]
        if spec:
            args += ["--speculative-config", json.dumps(spec)]
        with open(log, "a") as handle:
            self.popen = subprocess.Popen(args, stdout=handle, stderr=subprocess.STDOUT,
                                          env={**os.environ, **env})
        self.client = OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key="none",
                             max_retries=0, timeout=600)
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.client.models.list()
                return
            except Exception:  # not up yet
                if self.popen.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"vLLM's server did not start; its log: {log}") from None
                time.sleep(1.0)

    def stop(self) -> None:
        self.popen.terminate()
        try:
            self.popen.wait(60)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()


def drive(server: Server, prompts: list, clients: int, max_tokens: int,
          during=None) -> dict:
    """The workload through `clients` concurrent SDK clients: outputs in order, tokens/s."""
    def one(prompt):
        if isinstance(prompt, list):  # a chat
            reply = server.client.chat.completions.create(
                model="served", messages=prompt, max_tokens=max_tokens, temperature=0)
            return reply.choices[0].message.content, reply.usage.completion_tokens
        reply = server.client.completions.create(model="served", prompt=prompt,
                                                 max_tokens=max_tokens, temperature=0)
        return reply.choices[0].text, reply.usage.completion_tokens

    if during is not None:
        threading.Timer(1.0, during).start()
    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        results = list(pool.map(one, prompts))
    wall = time.perf_counter() - t0
    tokens = sum(n for _, n in results)
    return {"outputs": [text for text, _ in results], "tokens": tokens, "wall_s": wall,
            "tokens_per_s": tokens / wall}


def requests_stored(db: Path) -> int:
    """Request records in the daemon's SQLite store (whichever daemon process wrote them)."""
    from autospec.store import open_store
    with open_store(f"sqlite:///{db}") as store:
        return store.count_requests()


def wait_for(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.5)
    return predicate()


def main(argv=None) -> dict:
    from autospec.bench.prompts import load_prompts
    from autospec.models.pairs import named_pair
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", default="reference")
    parser.add_argument("--prompts", type=Path, default=None)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--passes", type=int, default=1,
                        help="the workload this many times in each phase")
    parser.add_argument("--num-speculative-tokens", type=int, default=8)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    spec = named_pair(args.pair)
    model = str(spec.locate()[0])
    workload = load_prompts(args.prompts or spec.workload("bench"))
    prompts = [[dict(m) for m in p.messages] if p.messages else p.prompt
               for p in workload] * args.passes
    tmp = Path(tempfile.mkdtemp(prefix="autospec-vllm-serving-"))
    proposer = {"method": "custom_class", "model": "autospec.vllm.Proposer",
                "num_speculative_tokens": args.num_speculative_tokens}
    log = tmp / "vllm.log"
    daemon_args = ["daemon", "--listen", f"unix:{tmp / 'daemon.sock'}", "--db",
                   f"sqlite:///{tmp / 'store.db'}", "--flush-interval", "0.2"]
    out: dict = {"pair": args.pair, "clients": args.clients, "requests": len(prompts),
                 "max_tokens": args.max_tokens}

    def phase(name, server, during=None):
        result = drive(server, prompts, args.clients, args.max_tokens, during)
        out[name] = {k: v for k, v in result.items() if k != "outputs"}
        out[name]["identical_to_plain"] = (result["outputs"] == out["plain_outputs"]
                                           if "plain_outputs" in out else True)
        print(f"{name}: {result['tokens_per_s']:.1f} tok/s, identical to plain "
              f"{out[name]['identical_to_plain']}", file=sys.stderr)
        return result

    server = Server(model, log, args.dtype, None, {})
    out["plain_outputs"] = phase("plain", server)["outputs"]
    server.stop()
    daemon = spawn(daemon_args, tmp / "daemon.log")
    env = {"AUTOSPEC_DAEMON": daemon.url}
    try:
        server = Server(model, log, args.dtype, proposer, env)
        phase("cold", server)
        db = tmp / "store.db"
        wait_for(lambda: requests_stored(db) == len(prompts), 30)
        out["cold"]["telemetry"] = requests_stored(db)
        server.stop()
        server = Server(model, log, args.dtype, proposer, env)
        time.sleep(6)  # the proposer pulls the daemon's estimates at start (every 5 s)
        phase("warm", server)
        wait_for(lambda: requests_stored(db) == 2 * len(prompts), 30)
        out["warm"]["telemetry"] = requests_stored(db) - len(prompts)
        phase("daemon_killed", server, during=daemon.kill)
        daemon = spawn(daemon_args, tmp / "daemon.log")  # the same socket and store
        wait_for(lambda: requests_stored(db) == 3 * len(prompts), 60)
        out["daemon_killed"]["telemetry"] = requests_stored(db) - 2 * len(prompts)
        server.stop()
    finally:
        daemon.kill()
    del out["plain_outputs"]
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return out


if __name__ == "__main__":
    main()
