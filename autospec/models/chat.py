"""Chat prompts: a list of {role, content} messages rendered with the target tokenizer's chat
template. The one place a chat becomes token ids, for bench (workload rows with "messages"),
`autospec generate --chat`, `autospec.generate(messages)` and /v1/chat/completions.
"""
from __future__ import annotations

ROLES = ("assistant", "system", "user")


class ChatError(ValueError):
    """Messages that cannot be rendered; the message names the field (`param`) at fault."""

    def __init__(self, message: str, param: str = "messages"):
        super().__init__(message)
        self.param = param


def check_messages(messages) -> tuple[dict, ...]:
    """A validated copy of `messages`: a non-empty list of {"role": one of ROLES, "content":
    str}. Errors name the message (`messages[1].role: ...`)."""
    if not isinstance(messages, list) or not messages:
        raise ChatError("messages: expected a non-empty list of {\"role\", \"content\"} objects, "
                        f"got {_short(messages)}")
    checked = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise ChatError(f"{where}: expected a {{\"role\", \"content\"}} object, got "
                            f"{_short(message)}", where)
        unknown = sorted(set(message) - {"role", "content"})
        if unknown:
            raise ChatError(f"{where}: unknown field(s) {unknown} (known: content, role)", where)
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            raise ChatError(f"{where}.role: unknown role {_short(role)} (known: "
                            f"{', '.join(ROLES)})", f"{where}.role")
        if not isinstance(content, str):
            raise ChatError(f"{where}.content: expected a string, got {_short(content)}",
                            f"{where}.content")
        checked.append({"role": role, "content": content})
    return tuple(checked)


def render_chat(pair, messages) -> str:
    """The prompt text for `messages` (checked first): the target tokenizer's chat template
    with the generation prompt (the assistant's turn opened), not tokenised."""
    from jinja2 import TemplateError
    messages = check_messages(list(messages))
    tokenizer = pair.tokenizer
    if not getattr(tokenizer, "chat_template", None):
        raise ChatError(f"pair '{pair.key}' has no chat template (its tokenizer_config.json "
                        f"has no chat_template): give it plain prompts")
    try:
        return tokenizer.apply_chat_template(list(messages), add_generation_prompt=True,
                                             tokenize=False)
    except TemplateError as exc:  # e.g. a template that insists on alternating roles
        raise ChatError(f"pair '{pair.key}': its chat template refused the messages: "
                        f"{exc}") from None


def encode_chat(pair, messages) -> list[int]:
    """Token ids for `messages`. The rendered text already holds every special token the
    template wants (a BOS included, where the template writes one), so it is encoded without
    adding special tokens again -- what transformers' own apply_chat_template(tokenize=True)
    does."""
    return pair.tokenizer.encode(render_chat(pair, messages), add_special_tokens=False)


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
