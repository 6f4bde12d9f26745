"""The agentic workload (configs/workloads/agentic.jsonl): answers that repeat across requests.

    python -m autospec.bench.agentic [--out configs/workloads]

Agents send one instruction again and again, over a different object each time, and their
answers share a shape: the same tool-call JSON, the same test scaffold, the same docstring
layout. Prompt lookup (`ngram`) sees only the current prompt; a drafter that remembers earlier
answers (`suffix`) sees the shape. Each prompt is a plain completion for the reference code
model: a real function, then a fixed scaffold that the answer continues.

Material: the installed sources of click, optuna and SQLAlchemy — not the standard library
the reference models trained on, and none of heldout.jsonl's packages. Public functions with a
docstring, in source order, of the modules in SOURCES; the output is deterministic for given
package versions (VERSIONS_NOTE names the ones shipped). Categories (8 each, interleaved):
- `tool-call`: a function's signature and docstring summary, then an agent's tool-call record
  opened under one schema (`{"tool": ..., "target": ..., "arguments": {...}, "reason": ...}`):
  the answer fills the same keys every time.
- `test`: a function (signature, docstring, body), then `def test_NAME():` of a pytest module
  that imports it: the answer is a test in the same template each time.
- `docstring`: a function of one module with its docstring taken out, then the same
  instruction as a comment and the function's first line again, a docstring opened: the answer
  writes a docstring in the module's house style (and then copies the body).
"""
from __future__ import annotations

import argparse
import ast
import importlib
import json
import textwrap
from dataclasses import dataclass
from pathlib import Path

PER_CATEGORY = 8
MAX_NEW_TOKENS = 128
MAX_PROMPT_CHARS = 1400

# category -> (modules its functions come from, most lines a function may have): one code base
# per category, so that the instruction really is the same over many functions of one library.
# A tool call shows only the signature and docstring summary, so any length will do there.
SOURCES = {
    "tool-call": (("optuna.study.study", "optuna.trial._trial", "optuna.storages._base"), 1000),
    "test": (("click.utils", "click.termui", "click.formatting", "click.core"), 30),
    "docstring": (("sqlalchemy.engine.base", "sqlalchemy.engine.result"), 30),
}
VERSIONS_NOTE = "click 8.5.1, optuna 5.0.0, SQLAlchemy 2.1.9"


@dataclass(frozen=True)
class Function:
    module: str
    qualname: str  # Class.method or function
    source: str  # dedented, docstring included
    signature: str  # the `def ...:` line(s)
    docstring: str
    body: str  # dedented, docstring excluded

    @property
    def name(self) -> str:
        return self.qualname.rsplit(".", 1)[-1]


def public_functions(module: str, min_lines: int = 4, max_lines: int = 30) -> list[Function]:
    """Public functions and methods of `module` (as installed) that have a docstring, in source
    order; properties, overloads and dunder methods left out."""
    path = Path(importlib.import_module(module).__file__)
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    found = []

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.FunctionDef) and not child.name.startswith("_"):
                decorators = {getattr(d, "id", getattr(d, "attr", "")) for d in child.decorator_list}
                doc = ast.get_docstring(child)
                span = child.end_lineno - child.lineno + 1
                if (doc and not decorators & {"property", "overload", "setter"}
                        and min_lines <= span <= max_lines and len(child.body) > 1):
                    first = child.decorator_list[0].lineno if child.decorator_list else child.lineno
                    head_end = child.body[0].lineno - 1  # the line before the docstring
                    body_start = child.body[1].lineno - 1
                    found.append(Function(
                        module, prefix + child.name,
                        textwrap.dedent("\n".join(lines[first - 1:child.end_lineno])),
                        textwrap.dedent("\n".join(lines[child.lineno - 1:head_end])),
                        doc, textwrap.dedent("\n".join(lines[body_start:child.end_lineno]))))
    visit(ast.parse(text), "")
    return found


# Each scaffold ends in the same words for every function (the function comes first): a model
# answers the same tail the same way, so earlier answers predict the next one, while the
# current prompt holds nothing of the answer to copy.
def tool_call(fn: Function) -> str:
    summary = fn.docstring.strip().split("\n\n")[0].replace("\n", " ")
    return (f"# {fn.module}.{fn.qualname}\n{fn.signature}\n    \"\"\"{summary}\"\"\"\n\n\n"
            "# Agent step: call the function above as a tool. Reply with one JSON object\n"
            "# under the schema {\"tool\": str, \"target\": str, \"arguments\": {name: value},\n"
            "# \"reason\": str}.\n"
            "CALL = {\"tool\": \"")


def test(fn: Function) -> str:
    import_name = fn.qualname.split(".", 1)[0]
    return (f"# {fn.module}\n{fn.source}\n\n\n"
            f"from {fn.module} import {import_name}\n\n\n"
            "# Tests for the function above: the usual case first, then the edge cases.\n"
            "class TestFunction(unittest.TestCase):\n\n"
            "    def test_usual_case(self):\n")


def docstring(fn: Function) -> str:
    undocumented = f"{fn.signature}\n{textwrap.indent(fn.body, '    ')}"
    return (f"{undocumented}\n\n\n"
            "# Add a docstring to the function above: one summary line, then Args, Returns and\n"
            "# Raises sections. The docstring:\n"
            "DOCSTRING = \"\"\"")


MAKERS = {"tool-call": tool_call, "test": test, "docstring": docstring}


def agentic_rows(per_category: int = PER_CATEGORY) -> list[dict]:
    """The rows, categories interleaved: per category, every other eligible function of its
    modules (in order) until `per_category` prompts fit MAX_PROMPT_CHARS."""
    columns = []
    for category, (modules, max_lines) in SOURCES.items():
        functions = [fn for module in modules for fn in public_functions(module, 4, max_lines)]
        rows = []
        for fn in functions[::2]:
            prompt = MAKERS[category](fn)
            if len(prompt) <= MAX_PROMPT_CHARS:
                rows.append({"id": f"{category}-{len(rows)}", "category": category,
                             "prompt": prompt, "max_new_tokens": MAX_NEW_TOKENS})
            if len(rows) == per_category:
                break
        if len(rows) < per_category:
            raise RuntimeError(f"only {len(rows)} {category} prompts in {', '.join(modules)}")
        columns.append(rows)
    return [row for group in zip(*columns) for row in group]


def build_agentic(out_dir: Path) -> Path:
    path = out_dir / "agentic.jsonl"
    out_dir.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in agentic_rows()))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("configs/workloads"))
    print(f"wrote {build_agentic(parser.parse_args().out)}")


if __name__ == "__main__":
    main()
