"""Build the shipped workloads (configs/workloads/*.jsonl) from held-out standard-library files.

    python -m autospec.bench.workloads [--out configs/workloads]

Only files the models never trained on (corpus.is_heldout) are used; the output is
deterministic for a given Python version. Categories, and who should win them:
- copy-heavy: a function, then its first lines again (a re-statement or an edit in progress);
  the continuation repeats text already in the prompt -> prompt lookup (ngram) should win.
- completion: 30 lines from the middle of a held-out module, continue the code -> a draft
  model or early exit should win.
- prose: the first part of a long docstring or comment block (English text, little
  repetition) -> drafting pays least; plain decoding may be best.
chat.jsonl (chat prompts for an Instruct target) is built by autospec.bench.chat_workloads,
whose `chat_prompts` also makes the draft's training prompts from the training split.
"""
from __future__ import annotations

import argparse
import ast
import json
import textwrap
from pathlib import Path

from autospec.bench.chat_workloads import build_chat, chat_prompts  # noqa: F401 (re-exported)
from autospec.models.corpus import default_corpus_dir, iter_sources, split
from autospec.models.evaluate import functions_of

PER_CATEGORY = 8
MAX_PROMPT_CHARS = 1600


def copy_heavy(files, count: int) -> list[dict]:
    rows = []
    for i, fn in enumerate(f for f in functions_of(files, 10, 30) if len(f) < MAX_PROMPT_CHARS // 2):
        if i % 5:  # spread the picks over the held-out files
            continue
        lines = fn.splitlines()
        if i % 2:
            # an edit in progress: the same function again under a new name
            name = lines[0].split("def ", 1)[1].split("(", 1)[0]
            head = lines[0].replace(f"def {name}(", f"def {name}_v2(", 1)
            prompt = f"{fn}\n\n\n{head}\n" + "\n".join(lines[1:2]) + "\n"
        else:
            prompt = f"{fn}\n\n\n" + "\n".join(lines[:2]) + "\n"
        rows.append({"prompt": prompt})
        if len(rows) == count:
            break
    return rows


def completion(files, count: int, lines: int = 30) -> list[dict]:
    rows = []
    for f in files:
        text_lines = f.text.splitlines()
        if len(text_lines) < 200:
            continue
        mid = len(text_lines) // 3
        prompt = "\n".join(text_lines[mid:mid + lines]) + "\n"
        if len(prompt) < MAX_PROMPT_CHARS:
            rows.append({"prompt": prompt})
        if len(rows) == count:
            break
    return rows


def prose(files, count: int) -> list[dict]:
    rows = []
    for f in files:
        try:
            tree = ast.parse(f.text)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)):
                continue
            doc = ast.get_docstring(node)
            if doc and 500 < len(doc) < 3000 and "    " not in doc and ">>>" not in doc:
                cut = len(doc) // 2
                cut = doc.rfind(" ", 0, cut)
                rows.append({"prompt": '"""' + textwrap.dedent(doc[:cut])})
                break
        if len(rows) == count:
            break
    return rows


def switching(files, count: int) -> list[dict]:
    """A short function, then its first two lines again: the output copies for ~60-100 tokens,
    then (the copy done) goes on as open completion — a phase change inside one request."""
    rows = []
    for i, fn in enumerate(f for f in functions_of(files, 6, 9) if len(f) < 500):
        if i % 3 == 1:
            lines = fn.splitlines()
            rows.append({"prompt": f"{fn}\n\n\n" + "\n".join(lines[:2]) + "\n",
                         "max_new_tokens": 192})
        if len(rows) == count:
            break
    return rows


MAKERS = (("copy-heavy", copy_heavy), ("completion", completion), ("prose", prose))


def build(out_dir: Path, corpus_dir: Path | None = None) -> list[Path]:
    """reference.jsonl (8 per category) and mixed.jsonl (other prompts of the same kinds,
    interleaved, plus `switch` prompts that change character halfway)."""
    _, heldout = split(iter_sources(corpus_dir or default_corpus_dir()))
    reference, mixed_columns = [], []
    for category, maker in MAKERS:
        made = maker(heldout, 2 * PER_CATEGORY)
        reference += [_row(category, i, r) for i, r in enumerate(made[:PER_CATEGORY])]
        mixed_columns.append([_row(category, i, r) for i, r in enumerate(made[PER_CATEGORY:], PER_CATEGORY)])
    mixed_columns.append([_row("switch", i, r) for i, r in enumerate(switching(heldout, 6))])
    mixed = [row for group in zip(*mixed_columns) for row in group]  # interleaved
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, rows in (("reference", reference), ("mixed", mixed)):
        path = out_dir / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        paths.append(path)
    return paths


# The held-out workload: the same makers over code no model or setting here was
# trained or tuned on — the installed sources of five third-party packages, not the standard
# library. Tune and choose defaults on reference and mixed only; report this one apart.
HELDOUT_PACKAGES = ("numpy", "yaml", "tqdm", "matplotlib", "aiohttp")


def heldout_sources() -> list:
    """Every .py file of HELDOUT_PACKAGES as installed, its relpath prefixed by the package
    (tests excluded: they repeat fixtures more than code does)."""
    import importlib
    from autospec.models.corpus import SourceFile
    files = []
    for name in HELDOUT_PACKAGES:
        root = Path(importlib.import_module(name).__file__).parent
        files += [SourceFile(f"{name}/{f.relpath}", f.text) for f in iter_sources(root)
                  if "tests" not in f.relpath.split("/")]
    return files


def build_heldout(out_dir: Path) -> Path:
    """heldout.jsonl: 8 prompts per category, interleaved, from HELDOUT_PACKAGES. The files
    are taken round-robin across packages so that no one package fills a category."""
    by_package = {name: [f for f in heldout_sources() if f.relpath.startswith(name + "/")]
                  for name in HELDOUT_PACKAGES}
    mixed_order = [f for group in _round_robin(list(by_package.values())) for f in group]
    columns = [[_row(category, i, r) for i, r in enumerate(maker(mixed_order, PER_CATEGORY))]
               for category, maker in MAKERS]
    rows = [row for group in zip(*columns) for row in group]
    path = out_dir / "heldout.jsonl"
    out_dir.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _round_robin(lists: list[list]) -> list[list]:
    """[[a0, b0, c0], [a1, b1, c1], ...] over lists of unequal length."""
    longest = max(map(len, lists))
    return [[l[i] for l in lists if i < len(l)] for i in range(longest)]


def _row(category: str, i: int, made: dict) -> dict:
    return {"id": f"{category}-{i}", "category": category, **made}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("configs/workloads"))
    parser.add_argument("--corpus", type=Path, default=None)
    args = parser.parse_args()
    for path in build(args.out, args.corpus) + [build_chat(args.out, args.corpus),
                                                build_heldout(args.out)]:
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
