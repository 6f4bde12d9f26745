"""Model pairs by name: where each named pair's target and draft live, declared once.

    reference   the shipped 11M pair (built on first use if this install lacks it)
    smollm2     SmolLM2-135M-Instruct, fetched once into the cache by `autospec models fetch
                smollm2`; its trained draft and trained early exit ship in the package
                (autospec/smollm2/draft, exit: both borrow the target's embedding, the exit
                also its first layers; without the draft the pair is target-only, without the
                exit early-exit runs the bare view)

`--pair NAME` (CLI), `autospec.load(pair=NAME)` and the store's pair key (`ModelPair.key`) all
read this table; models/pair.py loads a pair by its name (`load_named_pair`).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from autospec.models import ModelLoadError
from autospec.paths import REFERENCE_DIR, SMOLLM2_SHIPPED_DIR, smollm2_dir, user_path

DEFAULT_PAIR = "reference"


@dataclass(frozen=True)
class NamedPair:
    name: str
    summary: str
    target: Callable[[], Path]  # the target's HF directory (a function: the cache can move)
    draft: Callable[[], Path]  # the draft's; absent -> the pair is target-only
    fetch: str | None = None  # the command that puts a missing target in place
    build_preset: str | None = None  # or: the `autospec models build` preset that makes it
    # configs/workloads/ files bench and demo run when given no --prompts: what the pair's
    # target is for (the reference pair continues raw code and prose; SmolLM2 is a chat model)
    bench_workload: str = "reference.jsonl"
    demo_workload: str = "mixed.jsonl"
    exit: Callable[[], Path] | None = None  # a trained early exit, where the pair ships one
    eagle: Callable[[], Path] | None = None  # a feature-level draft head, where it ships one
    chat: bool = False  # a chat model: chat requests are served (else refused: not_a_chat_model)

    def workload(self, which: str) -> Path:
        """The default workload file for `bench` or `demo` (installed as autospec.configs)."""
        from importlib.resources import files
        name = self.bench_workload if which == "bench" else self.demo_workload
        return Path(str(files("autospec.configs") / "workloads" / name))

    def locate(self) -> tuple[Path, Path | None]:
        """(target dir, draft dir or None), building a missing buildable target; a missing
        fetched target is an error that names the command to run."""
        target = self.target()
        if not _is_model_dir(target):
            if self.fetch:
                raise ModelLoadError(f"pair '{self.name}' needs its target, which is not in "
                                     f"{target}: run `{self.fetch}` first")
            from autospec.models.build import build
            build(self.build_preset)
        draft = self.draft()
        return target, draft if _is_model_dir(draft) else None

    def exit_dir(self) -> Path | None:
        path = self.exit() if self.exit else None
        return path if path is not None and _is_model_dir(path) else None

    def eagle_dir(self) -> Path | None:
        path = self.eagle() if self.eagle else None
        return path if path is not None and _is_model_dir(path) else None


PAIRS: dict[str, NamedPair] = {p.name: p for p in (
    NamedPair("reference", "the shipped 11M pair (target + draft)",
              lambda: REFERENCE_DIR / "target", lambda: REFERENCE_DIR / "draft",
              build_preset="reference"),
    NamedPair("smollm2", "SmolLM2-135M-Instruct (chat), fetched into the cache",
              lambda: smollm2_dir() / "target", lambda: SMOLLM2_SHIPPED_DIR / "draft",
              fetch="autospec models fetch smollm2", bench_workload="chat.jsonl",
              demo_workload="chat.jsonl", exit=lambda: SMOLLM2_SHIPPED_DIR / "exit",
              eagle=lambda: SMOLLM2_SHIPPED_DIR / "eagle", chat=True),
)}


def not_a_chat_model(key: str) -> str | None:
    """Why a chat to the pair `key` is refused, or None where it is served. A named pair that
    is not a chat model (the reference pair continues Python source and prose: a chat to it
    comes back as junk) is refused; any other model is served where its tokenizer has a
    chat template (models/chat.py says so otherwise)."""
    pair = PAIRS.get(key)
    if pair is None or pair.chat:
        return None
    chats = ", ".join(name for name, p in PAIRS.items() if p.chat)
    return (f"the {key} pair is not a chat model (it continues code and prose): send the text "
            f"as a completion prompt, or chat with a chat pair ({chats})")


def named_pair(name: str) -> NamedPair:
    if name not in PAIRS:
        raise ModelLoadError(f"unknown pair '{name}' (known: {', '.join(sorted(PAIRS))})")
    return PAIRS[name]


def pair_name_for(target: str, draft: str | None) -> str | None:
    """The name of the pair these model paths are, or None. A named target without a draft
    is still that pair (target-only): its draft-model estimates are simply never made."""
    for spec in PAIRS.values():
        if _same(target, spec.target()) and (draft is None or _same(draft, spec.draft())):
            return spec.name
    return None


def _same(path: str, expected: Path) -> bool:
    return user_path(path).resolve() == user_path(expected).resolve()


def _is_model_dir(path: Path) -> bool:
    return (path / "config.json").is_file()
