"""llama.cpp as a bench peer (bench/llamacpp.py): its methods parse, say what to install when
llama-cpp-python is missing, and need the pair's GGUF; with llama-cpp-python installed and
SmolLM2 fetched, it decodes the GGUF greedily, prompt lookup giving plain's tokens."""
import sys

import pytest

from autospec.bench.llamacpp import gguf_of, llamacpp_runner
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
    with pytest.raises(ValueError, match=r"needs llama-cpp-python: pip install -e '.\[llamacpp\]'"):
        llamacpp_runner(parse_method("llamacpp:plain"), tiny_engine)


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
