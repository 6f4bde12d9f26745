"""A workload's prompts: a workload JSONL read into `Prompt`s (`load_prompts`, every error
naming the file, the line and the field), and a prompt's token ids for an engine
(`prompt_ids`: a chat rendered with the target's template)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from autospec.engine.loop import Engine
from autospec.models.chat import ChatError, check_messages, encode_chat


@dataclass
class Prompt:
    """One workload row: a plain `prompt`, or a chat (`messages`) for the target's template."""
    id: str
    prompt: str | None
    category: str
    max_new_tokens: int | None = None
    messages: tuple[dict, ...] | None = None


def prompt_ids(engine: Engine, p: Prompt) -> list[int]:
    """The row's token ids: the prompt encoded, or the chat rendered (autospec/models/chat.py)."""
    if p.messages is not None:
        return encode_chat(engine.models, p.messages)
    return engine.encode(p.prompt)


def load_prompts(path: Path) -> list[Prompt]:
    """Read a workload JSONL; each error names the file, the line and the field."""
    prompts = []
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise ValueError(f"cannot read prompts '{path}': {exc.strerror}") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{n}: not JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{n}: expected an object")
        if not isinstance(row.get("id"), str) or not row["id"]:
            raise ValueError(f"{path}:{n}: field 'id' must be a non-empty string")
        messages = None
        if "messages" in row:
            if "prompt" in row:
                raise ValueError(f"{path}:{n}: give 'prompt' or 'messages', not both")
            try:
                messages = check_messages(row["messages"])
            except ChatError as exc:
                raise ValueError(f"{path}:{n}: {exc}") from None
        elif "prompt" not in row:
            raise ValueError(f"{path}:{n}: give 'prompt' (a string) or 'messages' (a chat)")
        elif not isinstance(row["prompt"], str) or not row["prompt"]:
            raise ValueError(f"{path}:{n}: field 'prompt' must be a non-empty string")
        if not isinstance(row.get("category"), str) or not row["category"]:
            raise ValueError(f"{path}:{n}: field 'category' must be a non-empty string")
        limit = row.get("max_new_tokens")
        if limit is not None and (not isinstance(limit, int) or limit < 1):
            raise ValueError(f"{path}:{n}: field 'max_new_tokens' must be a positive integer")
        prompts.append(Prompt(row["id"], row.get("prompt"), row["category"], limit, messages))
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    return prompts
