"""llama.cpp as a bench peer (bench/llamacpp.py): its methods parse, say what to install when
llama-cpp-python is missing, and need the pair's GGUF; a peer that dies (the native build's
"Illegal instruction" on AMX CPUs) or hangs is an error naming the CMAKE_ARGS fix; with
llama-cpp-python installed and SmolLM2 fetched, it decodes the GGUF greedily, prompt lookup
giving plain's tokens."""
import sys
from pathlib import Path

import pytest

from autospec.bench.llamacpp import CMAKE_ARGS, check_runs, gguf_of, llamacpp_runner
from autospec.method import parse_method


def test_methods_parse():
    assert parse_method("llamacpp:plain").kind == "llamacpp"
    lookup = parse_method("llamacpp:prompt-lookup:2")
    assert (lookup.baseline, lookup.k) == ("prompt-lookup", 2)
    assert parse_method("llamacpp:prompt-lookup").k == 4
    with pytest.raises(ValueError, match="unknown method 'llamacpp:eagle'"):
        parse_method("llamacpp:eagle")


def test_missing_llama_cpp_python_names_the_install(monkeypatch, tiny_engine):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    with pytest.raises(ValueError, match=r"needs llama-cpp-python: CMAKE_ARGS=.*GGML_NATIVE=OFF"
                                         r".* pip install -e '.\[llamacpp\]'"):
        llamacpp_runner(parse_method("llamacpp:plain"), tiny_engine)


def _child(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_a_peer_that_dies_by_illegal_instruction_names_the_cmake_args_fix():
    dies = _child("import os, signal; os.kill(os.getpid(), signal.SIGILL)")
    with pytest.raises(ValueError, match="llamacpp:plain: llama.cpp died .Illegal instruction, "
                                         "SIGILL.") as caught:
        check_runs(Path("model.gguf"), "llamacpp:plain", dies)
    assert CMAKE_ARGS in str(caught.value) and "GGML_NATIVE=OFF" in CMAKE_ARGS


def test_a_peer_that_hangs_or_fails_is_an_error_not_a_wait():
    with pytest.raises(ValueError, match=r"did not decode two tokens of model.gguf in 1 s .hung."):
        check_runs(Path("model.gguf"), "llamacpp:plain", _child("import time; time.sleep(30)"),
                   timeout=1)
    with pytest.raises(ValueError, match=r"failed on model.gguf .exit 3: no such file."):
        check_runs(Path("model.gguf"), "llamacpp:plain",
                   _child("import sys; print('no such file', file=sys.stderr); sys.exit(3)"))
    check_runs(Path("model.gguf"), "llamacpp:plain", _child("pass"))  # a peer that runs: silent


def test_a_pair_without_a_gguf_is_named(tiny_engine):
    with pytest.raises(ValueError, match="has none beside it"):
        gguf_of(tiny_engine)


def test_llama_cpp_decodes_the_gguf_and_prompt_lookup_keeps_its_output():
    pytest.importorskip("llama_cpp")
    from autospec.models.fetch import is_fetched
    if not is_fetched("smollm2"):
        pytest.skip("SmolLM2 is not fetched (autospec models fetch smollm2)")
    import autospec
    engine = autospec.load(pair="smollm2")
    ids = engine.encode("def add(a, b):\n    return a + b\n\ndef sub(a, b):\n")
    plain = llamacpp_runner(parse_method("llamacpp:plain"), engine)(ids, 24, 0.0, 0, None)
    lookup = llamacpp_runner(parse_method("llamacpp:prompt-lookup:4"), engine)(ids, 24, 0.0, 0, None)
    assert len(plain.token_ids) > 0 and plain.wall_s > 0
    assert lookup.token_ids == plain.token_ids
