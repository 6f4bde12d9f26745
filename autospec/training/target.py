"""The fetched SmolLM2 target every SmolLM2 recipe starts from (the distilled draft, the
trained exit, the feature head), and whose cost a card measures its draft against."""
from __future__ import annotations

import torch

from autospec.models.pairs import named_pair


def load_target():
    """The fetched SmolLM2 target (float32) and its tokenizer; where it is missing, the pair
    table's error names the fetch command."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    path, _ = named_pair("smollm2").locate()
    tokenizer = AutoTokenizer.from_pretrained(path)
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval(), tokenizer
