"""Chat workloads (configs/workloads/chat.jsonl) and the chat prompt makers: well-formed rows,
held-out sources only for the workload, training sources only for the draft's prompts,
deterministic builds, and a shipped file that is the makers' output.

Which functions and passages the builder picks depends on the standard library it reads, so
chat.jsonl is rebuilt byte for byte only on the Python it was built from; what the makers
write for a function or passage does not, so that is what is checked on any Python."""
from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from collections import Counter

import pytest

from autospec.bench import workloads
from autospec.bench.chat_workloads import (CATEGORIES, MAKERS, MAX_NEW_TOKENS, MAX_PROMPT_CHARS,
                                           PER_CATEGORY, Passage, _english, build_chat,
                                           chat_prompts, complete, edit, prose, units_of)
from autospec.models.corpus import SourceFile, default_corpus_dir, is_heldout, iter_sources, split
from conftest import REPO_ROOT

CHAT = REPO_ROOT / "configs" / "workloads" / "chat.jsonl"
PASSAGE = "Here is a passage from the source of a Python module:\n\n"  # prose's preamble


@pytest.fixture(scope="module")
def corpus():
    """(train, heldout, {relpath: text})."""
    files = iter_sources(default_corpus_dir())
    train, heldout = split(files)
    return train, heldout, {f.relpath: f.text for f in files}


def _content(row: dict) -> str:
    return row["messages"][0]["content"]


def _quoted_lines(row: dict) -> list[str]:
    """Non-blank lines of what the prompt quotes: the fenced code, or the prose passage."""
    text = _content(row)
    fenced = re.findall(r"```python\n(.*?)\n```", text, re.S)
    if row["category"] != "prose":
        assert fenced, row["id"]
        return [line.strip() for block in fenced for line in block.splitlines() if line.strip()]
    passage = text.split(":\n\n", 1)[1]  # after "Here is a passage ...:"
    return [line.strip() for line in passage.splitlines()
            if line.strip() and not line.rstrip().endswith("?") and "main points" not in line
            and not line.startswith("Summarise")]


def test_chat_jsonl_rows_are_well_formed():
    rows = [json.loads(line) for line in CHAT.read_text().splitlines()]
    assert len(rows) == len(CATEGORIES) * PER_CATEGORY == 24
    assert len({r["id"] for r in rows}) == len(rows)
    assert Counter(r["category"] for r in rows) == {c: PER_CATEGORY for c in CATEGORIES}
    assert [r["category"] for r in rows[:4]] == list(CATEGORIES)  # interleaved
    for r in rows:
        assert set(r) == {"id", "category", "messages", "max_new_tokens"}, r["id"]
        assert r["max_new_tokens"] == MAX_NEW_TOKENS
        assert r["messages"] and all(set(m) == {"role", "content"} for m in r["messages"])
        assert all(m["role"] in ("system", "user", "assistant") for m in r["messages"])
        assert all(isinstance(m["content"], str) and m["content"].strip() for m in r["messages"])
        assert [m["role"] for m in r["messages"]] == ["user"]  # no system message of our own
        assert len(_content(r)) <= MAX_PROMPT_CHARS  # under ~1200 tokens
    edits = [_content(r) for r in rows if r["category"] == "edit"]
    assert all("the whole function" in c and "```python" in c for c in edits)


def test_chat_workload_quotes_held_out_files_only(corpus):
    _, heldout, texts = corpus
    rows = chat_prompts(heldout, PER_CATEGORY, seed=0)
    assert Counter(r["category"] for r in rows) == {c: PER_CATEGORY for c in CATEGORIES}
    for r in rows:
        assert is_heldout(r["source"]), r
        for line in _quoted_lines(r):
            assert line in texts[r["source"]], (r["id"], line)


def _function(code: str, category: str):
    """The function a row quotes, parsed back. A complete row quotes only the signature and
    docstring: a 3-line body goes back under them, at the one indent that parses."""
    if category == "complete":
        for indent in ("    ", "  ", "        ", "\t"):
            body = "".join(f"\n{indent}{line}" for line in ("a = 1", "b = a", "return b"))
            try:
                ast.parse(code + body)
            except SyntaxError:
                continue
            code += body
            break
    fns, _ = units_of(SourceFile("shipped.py", code))
    assert fns and fns[0].lineno == 1, code  # the quoted function, outermost
    return fns[0]


def test_shipped_chat_jsonl_is_what_the_makers_write():
    """Every row is its category's maker's message for what the row quotes, at the row's index
    (its phrasing, the edit asked for, the cut of a completion), and the file is build_chat's
    serialisation of its rows: a hand edit or a maker changed since the build fails here."""
    lines = CHAT.read_text().splitlines(keepends=True)
    rows = [json.loads(line) for line in lines]
    assert lines == [json.dumps(r) + "\n" for r in rows]
    for row in rows:
        i, content = int(row["id"].rsplit("-", 1)[1]), _content(row)
        if row["category"] == "prose":
            block = content[content.index(PASSAGE) + len(PASSAGE):]
            text = block if i % 2 == 0 else block.rsplit("\n\n", 1)[0]  # question first / last
            assert 400 <= len(text) <= 1500 and _english(text), row["id"]  # units_of would take it
            assert prose(Passage("shipped.py", 1, text), i) == content, row["id"]
            continue
        [code] = re.findall(r"```python\n(.*?)\n```", content, re.S)
        assert MAKERS[row["category"]](_function(code, row["category"]), i) == content, row["id"]


def test_training_prompts_never_quote_a_held_out_file(corpus):
    train, _, texts = corpus
    rows = chat_prompts(train, 3, seed=1)
    assert Counter(r["category"] for r in rows) == {c: 3 for c in CATEGORIES}
    for r in rows:
        assert not is_heldout(r["source"]), r
        for line in _quoted_lines(r):
            assert line in texts[r["source"]], (r["id"], line)


def test_builders_are_deterministic(corpus, tmp_path):
    train = corpus[0][:200]
    assert chat_prompts(train, 2, seed=3) == chat_prompts(train, 2, seed=3)
    assert chat_prompts(train, 2, seed=3) != chat_prompts(train, 2, seed=4)
    first, second = build_chat(tmp_path / "a"), build_chat(tmp_path / "b")
    assert first.read_bytes() == second.read_bytes()
    # and in another process, under another hash seed
    code = "import sys; from pathlib import Path; from autospec.bench.chat_workloads import " \
           "build_chat; build_chat(Path(sys.argv[1]))"
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "c")], check=True,
                   env={**os.environ, "PYTHONHASHSEED": "12345"})
    assert (tmp_path / "c" / "chat.jsonl").read_bytes() == first.read_bytes()
    assert workloads.build_chat is build_chat and workloads.chat_prompts is chat_prompts


SAMPLE = SourceFile("pkg/sample.py", '''
class Box:
    def total(self, items, scale=1):
        """Sum the items, scaled.

        Items that are None count as nothing.
        """
        out = 0
        for item in items:
            if item is None:
                continue
            out += item * scale
        return out
''')


def test_makers_on_a_hand_written_function():
    [fn], _ = units_of(SAMPLE)
    assert fn.source.startswith("def total(self, items, scale=1):")  # dedented
    rename = edit(fn, 0)
    name, new = re.search(r"`(\w+)` to `(\w+)`", rename).groups()
    assert fn.source.count(name) >= 2 and new not in fn.source
    assert "the whole function" in rename and fn.source in rename
    assert "`result` instead of `out`" in edit(fn, 3)
    assert edit(fn, 2) is None  # has a docstring already
    body_removed = complete(fn, 0)
    assert "count as nothing." in body_removed and "out += item" not in body_removed
    ast.parse(re.search(r"```python\n(.*)\n```", body_removed, re.S).group(1) + "\n    pass")
