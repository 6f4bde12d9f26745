"""The peer a CPU user picks for a GGUF model: llama.cpp, through llama-cpp-python.

`llamacpp:plain` decodes the pair's own GGUF (kept beside a fetched target: models/fetch.py)
greedily; `llamacpp:prompt-lookup:K` with llama-cpp-python's prompt-lookup draft of K tokens.
Threads: torch's (the same cores as our engine). Its output is compared with
`llamacpp:plain`'s, not ours: llama.cpp's arithmetic (its own Q4_1 and Q8_0 products) is
another rounding of the same model.

An optional extra (`pip install -e '.[llamacpp]'`): llama-cpp-python builds llama.cpp from
source, ~5 minutes on 2 cores, which is why the test line does not install it.
"""
from __future__ import annotations

import time
from pathlib import Path

import torch

from autospec.bench.methods import RunResult, Runner

INSTALL = "pip install -e '.[llamacpp]' (builds llama.cpp from source: ~5 min)"


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
    llm = Llama(str(gguf_of(engine)), n_ctx=max_len, n_threads=threads, n_threads_batch=threads,
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
