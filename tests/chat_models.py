"""A copy of the tiny target whose tokenizer has a chat template (the tiny preset has none)."""
from __future__ import annotations

import shutil
from pathlib import Path

# ChatML, as SmolLM2-Instruct writes it (without its default system prompt)
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def chat_target(tiny_dir: Path, out: Path) -> Path:
    """tiny_dir/target copied to `out`, its tokenizer saved with the CHATML template."""
    from transformers import AutoTokenizer
    shutil.copytree(tiny_dir / "target", out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    tokenizer.chat_template = CHATML
    tokenizer.save_pretrained(out)
    return out


def chatml(messages) -> str:
    """What CHATML renders, written out by hand (the generation prompt included)."""
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages) + \
        "<|im_start|>assistant\n"
