"""Chat workloads for an Instruct target: configs/workloads/chat.jsonl, and the same prompt
makers over any list of files.

chat.jsonl is built from held-out standard-library files only (corpus.is_heldout); the draft
model's self-distillation prompts come from the TRAINING split through `chat_prompts`, with the
same makers, so the two look alike and never share a file. Categories, and who should win them:
- edit: a function and an instruction whose answer restates most of it (rename a variable, add
  type hints, add a docstring, use `result` for the returned variable) -> prompt lookup (ngram).
- complete: a real function's signature and docstring, body removed: write the body -> a draft
  model.
- explain: a function, "explain it step by step" -> a draft model.
- prose: a long English docstring or comment block and a question about it -> a draft model,
  or plain decoding.
Rows: `{"id", "category", "messages": [{"role": "user", "content"}], "max_new_tokens"}`; no
system message (the target's chat template adds its own default).
"""
from __future__ import annotations

import ast
import json
import random
import re
import textwrap
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from autospec.models.corpus import SourceFile, default_corpus_dir, iter_sources, split

CATEGORIES = ("edit", "complete", "explain", "prose")
PER_CATEGORY = 6
MAX_NEW_TOKENS = 128
MAX_PROMPT_CHARS = 4200  # ~1200 tokens at ~3.5 characters a token

NEW_NAMES = ("value", "item", "entry", "current", "element", "record", "part", "piece")
OUT_NAMES = ("out", "res", "ret", "rv", "retval", "rval", "output", "buf", "acc")
STOP_WORDS = frozenset("""about above after again against other their there these those
    which while would could should being before where under until since every because
    first second given using often""".split())


@dataclass(frozen=True)
class Function:
    """One function of a source file, dedented, with its node."""
    relpath: str
    lineno: int  # of the `def` in the file
    source: str
    node: ast.FunctionDef | ast.AsyncFunctionDef  # line numbers are the file's

    @property
    def lines(self) -> int:
        return self.source.count("\n") + 1

    @property
    def code_lines(self) -> int:
        """Lines from the first statement after the docstring (if any) to the end."""
        body = self.node.body[1:] if ast.get_docstring(self.node) is not None else self.node.body
        return self.node.end_lineno - body[0].lineno + 1 if body else 0


@dataclass(frozen=True)
class Passage:
    """A long docstring or comment block of a source file, as plain text."""
    relpath: str
    lineno: int
    text: str


# ---------------------------------------------------------------------------------- makers
# Each maker turns one function (or passage) and the prompt's index in its category into a
# user message, or None when that function does not fit. The index varies the phrasing.

def _code(source: str) -> str:
    return f"```python\n{source}\n```"


def _ask_around(ask: str, block: str, i: int) -> str:
    """Instruction first, or (every other prompt) the material first."""
    return f"{ask}\n\n{block}" if i % 2 == 0 else f"{block}\n\n{ask}"


def _words(source: str) -> set[str]:
    return set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", source))


def _locals(node) -> Counter:
    """Occurrences of each name the function binds (parameters and assignments), `self`,
    `cls` and `_` left out."""
    bound = {a.arg for a in ast.walk(node.args) if isinstance(a, ast.arg)}
    bound |= {n.id for n in ast.walk(node)
              if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    bound -= {"self", "cls", "_"}
    uses = Counter(n.id for n in ast.walk(node) if isinstance(n, ast.Name) and n.id in bound)
    uses.update(a.arg for a in ast.walk(node.args) if isinstance(a, ast.arg) and a.arg in bound)
    return uses


def _rename(fn: Function, i: int) -> str | None:
    uses = [(name, n) for name, n in _locals(fn.node).items() if n >= 2 and len(name) > 1]
    if not uses:
        return None
    name = max(uses, key=lambda u: u[1])[0]  # the most used; ties: the first seen
    taken = _words(fn.source)
    new = next((w for w in NEW_NAMES[i % len(NEW_NAMES):] + NEW_NAMES if w not in taken), None)
    if new is None:
        return None
    return (f"Rename the variable `{name}` to `{new}` in this function." if i % 3 else
            f"In the function below, change the name `{name}` to `{new}` everywhere it is used.")


def _hints(fn: Function, i: int) -> str | None:
    args = [a for a in ast.walk(fn.node.args) if isinstance(a, ast.arg)]
    if fn.node.returns or any(a.annotation for a in args):
        return None  # annotated already
    if all(a.arg in ("self", "cls") for a in args):
        return None
    return ("Add type hints to this function's parameters and return value." if i % 3 else
            "Annotate this function with type hints (parameters and return type).")


def _docstring(fn: Function, i: int) -> str | None:
    if ast.get_docstring(fn.node) is not None:
        return None
    return ("Add a docstring to this function." if i % 3 else
            "Write a short docstring for this function and put it in place.")


def _result(fn: Function, i: int) -> str | None:
    bound = _locals(fn.node)
    assigned = {n.id for n in ast.walk(fn.node)
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    returned = [r.value.id for r in ast.walk(fn.node) if isinstance(r, ast.Return)
                and isinstance(r.value, ast.Name) and r.value.id in assigned]
    name = next((n for n in OUT_NAMES + tuple(returned) if bound.get(n, 0) >= 2), None)
    if name is None or "result" in _words(fn.source):
        return None
    return (f"Rewrite this function with `result` instead of `{name}`." if i % 3 else
            f"Use the name `result` instead of `{name}` in this function.")


EDITS = (_rename, _hints, _docstring, _result)
WHOLE = ("Reply with the whole function in a ```python block.",
         "Give me the whole function, in a ```python block.",
         "Show the whole function afterwards in a ```python block.")


def edit(fn: Function, i: int) -> str | None:
    """A function of 8-25 lines and an edit whose answer restates most of it."""
    if not 8 <= fn.lines <= 25 or fn.code_lines < 5:
        return None
    ask = EDITS[i % len(EDITS)](fn, i)  # the index picks the kind of edit
    return _ask_around(f"{ask} {WHOLE[i % len(WHOLE)]}", _code(fn.source), i) if ask else None


COMPLETE = ("Write the body of this function.",
            "Implement this function.",
            "Here is a function's signature and docstring. Write the body.",
            "Implement this function so that it does what its docstring says.")


def complete(fn: Function, i: int) -> str | None:
    """A real function's signature and docstring, body removed (the body had 3-30 lines)."""
    doc = ast.get_docstring(fn.node)
    if not doc or not 40 <= len(doc) <= 800 or len(fn.node.body) < 2:
        return None
    if not 3 <= fn.code_lines <= 30:
        return None
    head_end = fn.node.body[0].end_lineno - fn.lineno + 1  # the docstring's last line
    lines = fn.source.splitlines()
    ask = COMPLETE[i % len(COMPLETE)]
    return f"{ask}\n\n" + _code("\n".join(lines[:head_end]))


EXPLAIN = ("Explain what this function does, step by step.",
           "What does this function do? Explain it step by step.",
           "Walk me through this function step by step: what does it do?")


def explain(fn: Function, i: int) -> str | None:
    """A function of 8-30 lines and a request to explain it."""
    if not 8 <= fn.lines <= 30 or fn.code_lines < 5:
        return None
    return _ask_around(EXPLAIN[i % len(EXPLAIN)], _code(fn.source), i)


def _topic(text: str) -> str | None:
    """The text's most frequent long word (ties: first seen), for "what does it say about X"."""
    words = [w for w in re.findall(r"[a-z]{5,}", text.lower()) if w not in STOP_WORDS]
    counts = Counter(words)  # insertion-ordered: max() keeps the first seen of equals
    return max(counts, key=counts.get) if counts else None


def prose(passage: Passage, i: int) -> str | None:
    """A long English passage and a question about it (summarise / about X / main points)."""
    topic = _topic(passage.text)
    questions = ("Summarise this text in a few sentences.",
                 f"What does the text say about {topic}?" if topic else None,
                 "List the main points of this text.")
    question = questions[i % 3] or questions[0]
    block = f"Here is a passage from the source of a Python module:\n\n{passage.text}"
    return _ask_around(question, block, i)


# --------------------------------------------------------------------------------- sources

def _english(text: str) -> bool:
    lines = text.splitlines()
    if ">>>" in text or "::" in text or any(line.startswith("    ") for line in lines):
        return False  # doctests, reST code blocks, indented code
    letters = sum(c.isalpha() or c.isspace() for c in text)
    lowered = text.lower()
    return letters >= 0.85 * len(text) and "copyright" not in lowered and "license" not in lowered


def units_of(f: SourceFile, lo: int = 400, hi: int = 1500) -> tuple[list[Function], list[Passage]]:
    """The file's functions (methods and nested ones too), and its passages: docstrings and
    blocks of `#` comment lines of lo-hi characters of English text. One parse."""
    try:
        tree = ast.parse(f.text)
    except SyntaxError:
        return [], []
    lines, fns, texts = f.text.splitlines(), [], []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno:
            source = textwrap.dedent("\n".join(lines[node.lineno - 1:node.end_lineno]))
            if source.startswith(("def ", "async def ")):  # else a string less indented than it
                fns.append(Function(f.relpath, node.lineno, source, node))
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if doc and lo <= len(doc) <= hi and _english(doc):
                texts.append(Passage(f.relpath, getattr(node, "lineno", 1), doc.strip()))
    block, start = [], 0
    for n, line in enumerate(lines + [""], 1):
        stripped = line.strip()
        if stripped.startswith("#") and not stripped.startswith("#!"):
            start = start or n
            block.append(stripped.lstrip("#").strip())
            continue
        text = "\n".join(block).strip()
        if block and lo <= len(text) <= hi and _english(text):
            texts.append(Passage(f.relpath, start, text))
        block, start = [], 0
    return fns, texts


MAKERS = {"edit": edit, "complete": complete, "explain": explain, "prose": prose}


def _boilerplate(relpath: str) -> bool:
    """Tests and generated codecs: visited last (real library code reads more like chat)."""
    parts = relpath.split("/")
    return (any(p in ("test", "tests", "idle_test", "encodings") for p in parts)
            or parts[-1].startswith("test_"))


def chat_prompts(files: list[SourceFile], per_category: int, seed: int = 0,
                 max_new_tokens: int = MAX_NEW_TOKENS) -> list[dict]:
    """Up to `per_category` chat prompts of each category from `files`, interleaved by category.

    Deterministic for given files and seed. Each category visits the files in its own seeded
    order (library code before tests and codecs) and takes at most one prompt per file per
    pass, so prompts spread over many files; no function or passage is used twice, nor a
    function name twice in one category. Rows: {"id", "category", "messages",
    "max_new_tokens", "source"}, "source" being the file's relative path (for checks;
    build_chat drops it).
    """
    cache: dict[str, tuple[list[Function], list[Passage]]] = {}
    used: set[tuple[str, int]] = set()  # (relpath, lineno) of what a prompt already quotes
    columns = []
    for category in CATEGORIES:
        rng = random.Random(f"{seed}:{category}")
        order = sorted(files, key=lambda f: f.relpath)
        rng.shuffle(order)
        order.sort(key=lambda f: _boilerplate(f.relpath))  # stable: keeps the seeded order
        column: list[dict] = []
        names: set[str] = set()
        added = True
        while added and len(column) < per_category:  # one pass over the files
            added = False
            for f in order:
                if len(column) >= per_category:
                    break
                if f.relpath not in cache:
                    cache[f.relpath] = units_of(f)
                fns, texts = cache[f.relpath]
                units = [u for u in (texts if category == "prose" else fns)
                         if (u.relpath, u.lineno) not in used
                         and not (isinstance(u, Function) and u.node.name in names)]
                rng.shuffle(units)
                for unit in units:
                    content = MAKERS[category](unit, len(column))
                    if content and len(content) <= MAX_PROMPT_CHARS:
                        used.add((unit.relpath, unit.lineno))
                        if isinstance(unit, Function):
                            names.add(unit.node.name)
                        column.append({"id": f"{category}-{len(column)}", "category": category,
                                       "messages": [{"role": "user", "content": content}],
                                       "max_new_tokens": max_new_tokens, "source": f.relpath})
                        added = True
                        break
        columns.append(column)
    depth = max((len(col) for col in columns), default=0)
    return [col[j] for j in range(depth) for col in columns if j < len(col)]


def build_chat(out_dir: Path, corpus_dir: Path | None = None) -> Path:
    """chat.jsonl: PER_CATEGORY prompts of each category from the held-out split."""
    _, heldout = split(iter_sources(corpus_dir or default_corpus_dir()))
    rows = chat_prompts(heldout, PER_CATEGORY, seed=0)
    counts = Counter(r["category"] for r in rows)
    if any(counts[c] < PER_CATEGORY for c in CATEGORIES):
        raise ValueError(f"held-out files gave too few chat prompts: {dict(counts)} "
                         f"(need {PER_CATEGORY} of each of {', '.join(CATEGORIES)})")
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "chat.jsonl"
    path.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "source"}) + "\n"
                            for r in rows))
    return path
