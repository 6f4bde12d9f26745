"""The peer a CPU user picks for a GGUF model: llama.cpp, through llama-cpp-python.

`llamacpp:plain` decodes the pair's own GGUF (kept beside a fetched target: models/fetch.py)
greedily; `llamacpp:prompt-lookup:K` with llama-cpp-python's prompt-lookup draft of K tokens.
Threads: torch's (the same cores as our engine). Its output is compared with
`llamacpp:plain`'s, not ours: llama.cpp's arithmetic (its own Q4_1 and Q8_0 products) is
another rounding of the same model.

An optional extra (`pip install -e '.[llamacpp]'`): llama-cpp-python builds llama.cpp from
source, ~5 minutes on 2 cores, which is why the test line does not install it. Built with its
native flags (GGML_NATIVE) on a CPU with AMX, llama.cpp repacks the weights for AMX and then
dies with "Illegal instruction" (SIGILL), taking the process with it; with the instruction
sets named (`CMAKE_ARGS`) it runs. So before a bench loads it, `check_runs` decodes two tokens
in a child process: a peer that dies or hangs there is a ValueError naming the signal and the
fix, before any timing, never a missing row or a hung bench.
"""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from autospec.bench.runner import RunResult, Runner

# llama.cpp's x86 instruction sets named, not probed: a native build dies on AMX CPUs
CMAKE_ARGS = ("-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON "
              "-DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AVX512_VBMI=ON")
INSTALL = (f"CMAKE_ARGS=\"{CMAKE_ARGS}\" pip install -e '.[llamacpp]' (builds llama.cpp from "
           f"source: ~5 min; on a CPU without AVX-512 drop the AVX512 flags)")
REBUILD = (f"rebuild it with the instruction sets named: CMAKE_ARGS=\"{CMAKE_ARGS}\" "
           f"pip install --force-reinstall --no-cache-dir llama-cpp-python==0.3.36")
CHECK_SECONDS = 300  # the child's load and two tokens: seconds on any machine that runs it
# the child: load the GGUF, decode two tokens greedily
_PROBE = """import sys
from llama_cpp import Llama
llm = Llama(sys.argv[1], n_ctx=64, n_threads=1, verbose=False)
for i, _ in enumerate(llm.generate([1, 2, 3], top_k=1, temp=0.0)):
    if i == 1:
        break
"""
_CHECKED: dict[str, None] = {}  # GGUFs a child decoded in this process


def gguf_of(engine) -> Path:
    from autospec.models.fetch import gguf_file
    found = gguf_file(Path(engine.models.target_name))
    if found is None:
        raise ValueError(f"llamacpp: methods run the pair's GGUF, and {engine.models.target_name} "
                         f"has none beside it (a fetched pair has: autospec models fetch smollm2)")
    return found


def llamacpp_runner(method, engine, max_len: int = 4096) -> Runner:
    try:
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
    except ImportError:
        raise ValueError(f"{method.spec} needs llama-cpp-python: {INSTALL}") from None
    draft = (LlamaPromptLookupDecoding(num_pred_tokens=method.k)
             if method.baseline == "prompt-lookup" else None)
    threads = torch.get_num_threads()
    gguf = gguf_of(engine)
    check_runs(gguf, method.spec)
    llm = Llama(str(gguf), n_ctx=max_len, n_threads=threads, n_threads_batch=threads,
                draft_model=draft, verbose=False)
    stops = set(engine.eos_ids)

    def run(ids, max_new_tokens, temperature, seed, workload):
        if temperature > 0:
            raise ValueError(f"{method.spec} runs greedy only (--temperature 0)")
        out = []
        t0 = time.perf_counter()
        for token in llm.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, reset=True):
            if token in stops:
                break
            out.append(token)
            if len(out) >= max_new_tokens:
                break
        return RunResult(out, time.perf_counter() - t0)
    return run


def check_runs(gguf: Path, spec: str, command: list[str] | None = None,
               timeout: float = CHECK_SECONDS) -> None:
    """Decode two tokens of `gguf` with llama.cpp in a child process (`command`: another
    child, for tests); a ValueError naming what happened and the fix where it died or hung.
    Once per GGUF per process."""
    if str(gguf) in _CHECKED and command is None:
        return
    argv = command or [sys.executable, "-c", _PROBE, str(gguf)]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ValueError(f"{spec}: llama.cpp did not decode two tokens of {gguf.name} in "
                         f"{timeout:.0f} s (hung); {REBUILD}") from None
    if done.returncode < 0:  # killed by a signal: SIGILL is the native build on an AMX CPU
        name = signal.Signals(-done.returncode).name
        what = "Illegal instruction" if name == "SIGILL" else "crashed"
        raise ValueError(f"{spec}: llama.cpp died ({what}, {name}) decoding {gguf.name}: its "
                         f"build uses instructions this CPU lacks or mishandles (a native build "
                         f"on an AMX CPU); {REBUILD}")
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ValueError(f"{spec}: llama.cpp failed on {gguf.name} (exit {done.returncode}: "
                         f"{last})")
    _CHECKED[str(gguf)] = None
