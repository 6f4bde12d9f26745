"""Pairs by name (--pair, autospec.load(pair=...)) and chat prompts (workload rows with
"messages", generate --chat): rendering with the target's chat template, and the errors."""
from __future__ import annotations

import json
import shutil

import pytest
from chat_models import chat_target, chatml
from clirun import invoke

import autospec
from autospec.bench.prompts import load_prompts, prompt_ids
from autospec.engine.loop import Engine
from autospec.models import pairs
from autospec.models import ModelLoadError
from autospec.models.pair import load_named_pair, load_pair
from conftest import TEST_DATA

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "def add(a, b):"}]


@pytest.fixture(scope="module")
def chat_dir(tiny_dir, tmp_path_factory):
    return chat_target(tiny_dir, tmp_path_factory.mktemp("chat") / "target")


@pytest.fixture(scope="module")
def chat_engine(chat_dir, tiny_dir):
    return Engine(load_pair(str(chat_dir), str(tiny_dir / "draft")))


def write_rows(path, *rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


# -- chat rows ---------------------------------------------------------------------------------
def test_chat_rows_render_with_the_targets_template(chat_engine, tmp_path):
    path = write_rows(tmp_path / "w.jsonl", {"id": "a", "prompt": "x = 1", "category": "code"},
                      {"id": "b", "messages": CHAT, "category": "chat", "max_new_tokens": 5})
    plain, chat = load_prompts(path)
    assert plain.messages is None and chat.prompt is None and chat.max_new_tokens == 5
    tokenizer = chat_engine.models.tokenizer
    # the template holds every special token: encoded once, nothing added on top
    assert prompt_ids(chat_engine, chat) == tokenizer.encode(chatml(CHAT), add_special_tokens=False)
    assert prompt_ids(chat_engine, plain) == chat_engine.encode("x = 1")


@pytest.mark.parametrize("row, message", [
    ({"id": "b", "category": "c"}, "give 'prompt' (a string) or 'messages' (a chat)"),
    ({"id": "b", "category": "c", "prompt": "x", "messages": CHAT},
     "give 'prompt' or 'messages', not both"),
    ({"id": "b", "category": "c", "messages": []}, "messages: expected a non-empty list"),
    ({"id": "b", "category": "c", "messages": "hi"}, "messages: expected a non-empty list"),
    ({"id": "b", "category": "c", "messages": [{"role": "robot", "content": "hi"}]},
     "messages[0].role: unknown role 'robot' (known: assistant, system, user)"),
    ({"id": "b", "category": "c", "messages": [CHAT[0], {"role": "user", "content": 3}]},
     "messages[1].content: expected a string, got 3"),
    ({"id": "b", "category": "c", "messages": [{"role": "user", "content": "x", "name": "n"}]},
     "messages[0]: unknown field(s) ['name']"),
    ({"id": "b", "category": "c", "messages": ["hi"]}, "messages[0]: expected a"),
])
def test_bad_chat_rows_name_the_file_and_row(tmp_path, row, message):
    path = write_rows(tmp_path / "w.jsonl", {"id": "a", "prompt": "x", "category": "c"}, row)
    with pytest.raises(ValueError) as exc:
        load_prompts(path)
    assert f"w.jsonl:2: {message}" in str(exc.value)


def test_a_pair_without_a_chat_template_is_named(tiny_engine, tmp_path):
    path = write_rows(tmp_path / "w.jsonl", {"id": "a", "messages": CHAT, "category": "c"})
    with pytest.raises(ValueError, match="has no chat template") as exc:
        prompt_ids(tiny_engine, load_prompts(path)[0])
    assert f"pair '{tiny_engine.models.key}'" in str(exc.value)


def test_bench_measures_chat_rows(chat_dir, tiny_dir, tmp_path):
    path = write_rows(tmp_path / "w.jsonl", {"id": "a", "messages": CHAT, "category": "chat"},
                      {"id": "b", "prompt": "def f(x):", "category": "code"})
    out = tmp_path / "bench.json"
    result = invoke(["bench", "--prompts", str(path), "--methods", "plain,static:ngram:2",
                     "--max-new-tokens", "6", "--json", str(out), "--target", str(chat_dir),
                     "--draft", str(tiny_dir / "draft")])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["methods"]["static:ngram:2"]["overall"]["identical_to_plain"] in (True, "near-tie")


def test_bench_chat_rows_on_a_pair_without_a_template(tiny_dir, tmp_path):
    path = write_rows(tmp_path / "w.jsonl", {"id": "a", "messages": CHAT, "category": "chat"})
    result = invoke(["bench", "--prompts", str(path), "--methods", "plain", "--target",
                     str(tiny_dir / "target"), "--draft", str(tiny_dir / "draft")])
    assert result.exit_code != 0 and "has no chat template" in result.output


def test_generate_chat_is_one_user_message(chat_dir, chat_engine):
    result = invoke(["generate", "--chat", "--prompt", "def add(a, b):", "--drafter", "none",
                     "--max-new-tokens", "6", "--json", "--target", str(chat_dir)])
    assert result.exit_code == 0, result.output
    telemetry = json.loads([ln for ln in result.output.splitlines() if ln.startswith("{")][-1])
    expected = chat_engine.models.tokenizer.encode(
        chatml([{"role": "user", "content": "def add(a, b):"}]), add_special_tokens=False)
    assert telemetry["prompt_tokens"] == len(expected)


def test_generate_chat_without_a_template(tiny_dir):
    result = invoke(["generate", "--chat", "--prompt", "hi", "--target", str(tiny_dir / "target")])
    assert result.exit_code != 0 and "has no chat template" in result.output


def test_autospec_generate_takes_a_chat(chat_dir, chat_engine):
    ids = chat_engine.models.tokenizer.encode(chatml(CHAT), add_special_tokens=False)
    out = autospec.generate(CHAT, target=str(chat_dir), drafter=None, max_new_tokens=6)
    assert out.telemetry.prompt_tokens == len(ids)
    assert out.token_ids == chat_engine.generate(ids, drafter=None, max_new_tokens=6).token_ids


# -- pairs by name -----------------------------------------------------------------------------
@pytest.mark.parametrize("command", [["generate", "--prompt", "x"], ["bench"], ["serve"],
                                     ["demo"], ["replay", "trace.json"]])
def test_unknown_pair_lists_the_known_ones(command):
    result = invoke([*command, "--pair", "smollm3"])
    assert result.exit_code != 0
    assert "unknown pair 'smollm3' (known: reference, smollm2)" in result.output


@pytest.mark.parametrize("command", [["generate", "--prompt", "x"], ["bench", "--limit", "1"],
                                     ["serve", "--port", "0"], ["demo", "--limit", "1"]])
def test_smollm2_before_its_fetch_says_what_to_run(command, tmp_path):
    result = invoke([*command, "--pair", "smollm2"], env={"AUTOSPEC_CACHE": str(tmp_path)})
    assert result.exit_code != 0
    assert "pair 'smollm2'" in result.output and "`autospec models fetch smollm2`" in result.output


@pytest.mark.parametrize("flag", ["--target", "--draft"])
def test_pair_with_target_or_draft_is_refused(flag):
    result = invoke(["generate", "--prompt", "x", "--pair", "reference", flag, "/some/model"])
    assert result.exit_code == 2
    assert "--pair reference names both models" in result.output and flag in result.output


def test_load_by_name_errors():
    with pytest.raises(ValueError, match=r"unknown pair 'nope' \(known: reference, smollm2\)"):
        autospec.load(pair="nope")
    with pytest.raises(ValueError, match="names both models"):
        autospec.load("/some/target", pair="reference")


def test_smollm2_is_found_in_the_cache_and_keyed_by_name(tiny_dir, tmp_path, monkeypatch):
    """A fetched target (here the tiny one, where the fetch puts SmolLM2's) and no shipped
    draft yet: the pair loads target-only, and the store keys it 'smollm2'."""
    monkeypatch.setenv("AUTOSPEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(pairs, "SMOLLM2_SHIPPED_DIR", tmp_path / "not-shipped-yet")
    with pytest.raises(ModelLoadError, match="autospec models fetch smollm2"):
        load_named_pair("smollm2")
    shutil.copytree(tiny_dir / "target", tmp_path / "cache" / "models" / "smollm2" / "target")
    models = load_named_pair("smollm2")
    assert models.draft is None and models.key == "smollm2"
    result = invoke(["generate", "--pair", "smollm2", "--prompt", "x = 1", "--max-new-tokens", "4",
                     "--drafter", "draft-model"])
    assert result.exit_code != 0 and "drafter 'draft-model' needs a draft model" in result.output
    result = invoke(["generate", "--pair", "smollm2", "--prompt", "x = 1", "--max-new-tokens", "4"])
    assert result.exit_code == 0, result.output


def test_the_reference_key_is_unchanged(tiny_pair):
    from autospec.models.pair import ModelPair
    from autospec.paths import REFERENCE_DIR
    ref = ModelPair(tiny_pair.target, tiny_pair.tokenizer, None, str(REFERENCE_DIR / "target"),
                    str(REFERENCE_DIR / "draft"))
    assert ref.key == "reference"
    assert tiny_pair.key == f"{tiny_pair.target_name}+{tiny_pair.draft_name}"


def test_replay_refuses_a_trace_of_another_pair(tmp_path):
    raw = json.loads((TEST_DATA / "trace-mixed-small.json").read_text())
    raw["models"] = {**raw.get("models", {}), "pair": "reference"}
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps(raw))
    result = invoke(["replay", str(trace), "--pair", "smollm2", "--controller", "plain"])
    assert result.exit_code != 0
    assert f"trace '{trace}' was recorded on pair 'reference', not 'smollm2'" in result.output
    result = invoke(["replay", str(trace), "--pair", "reference", "--controller", "plain"])
    assert result.exit_code == 0, result.output


def test_the_reference_pair_answers_a_chat_as_a_prompt(reference_pair):
    """The default pair ships a raw chat template (its target was never taught a dialogue
    format): a chat is its messages' contents, each ending in a newline."""
    from autospec.engine.loop import Engine
    from autospec.models.chat import encode_chat
    messages = [{"role": "user", "content": "def add(a, b):"}]
    ids = encode_chat(reference_pair, messages)
    assert reference_pair.tokenizer.decode(ids) == "def add(a, b):\n"
    out = Engine(reference_pair).generate(ids, drafter=None, max_new_tokens=8)
    assert out.token_ids
