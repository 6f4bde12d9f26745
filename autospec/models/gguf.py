"""GGUF files, read in one place: a GGUF's metadata, its conversion into a plain Hugging Face
checkpoint (transformers de-quantizes it; the tokenizer mended where its loader falls short),
and its own 4-bit blocks by HF module name, which `--weights int4` runs as they are
(models/weights.py). models/fetch.py fetches the GGUF and calls these."""
from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from autospec.models.fetch_errors import FetchError, writing
from autospec.models.pair import quiet_loading
from autospec.models.weights import GROUP, Int4Blocks

log = logging.getLogger("autospec.weights")  # a block tensor left out is a weight format's warning

# the GGUF block types whose values `int4` runs as they are: (bytes per block, has an offset)
GGUF_INT4 = {"Q4_0": (18, False), "Q4_1": (20, True)}


def read_gguf_metadata(gguf_path: Path) -> dict:
    """The GGUF's scalar metadata (strings and numbers; arrays are skipped). Raises FetchError
    on a file the gguf reader cannot parse."""
    from gguf import GGUFReader, GGUFValueType
    try:
        reader = GGUFReader(str(gguf_path))
    except Exception as exc:  # the reader raises ValueError, struct.error, IndexError, ...
        raise FetchError(f"{gguf_path} is not a readable GGUF file: {exc}") from None
    meta = {}
    for key, field in reader.fields.items():
        if not field.types or field.types[0] == GGUFValueType.ARRAY or not field.data:
            continue
        value = field.parts[field.data[0]]  # a numpy array: the string's bytes or one number
        meta[key] = (bytes(value).decode("utf-8", "replace")
                     if field.types[0] == GGUFValueType.STRING else value.tolist()[0])
    return meta


def _split_digits(tokenizer, pre: str | None) -> bool:
    """llama.cpp's `smollm` pre-tokenizer isolates every digit before the GPT-2 split (as the
    original HF tokenizer does with `Digits(individual_digits=True)`); transformers' GGUF loader
    does not know that name and falls back to plain ByteLevel, which glues a run of spaces to
    the digits after it ("  22" -> "Ġ","Ġ","2","2" instead of "ĠĠ","2","2"). Put it back, unless
    the loaded tokenizer already splits digits (a newer transformers)."""
    from tokenizers import pre_tokenizers
    if pre != "smollm":
        return False
    backend = tokenizer.backend_tokenizer
    pieces = [p for p, _ in backend.pre_tokenizer.pre_tokenize_str("a 12")] \
        if backend.pre_tokenizer is not None else []
    if pieces[-2:] == ["1", "2"]:
        return False
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    return True


def end_of_turn_token(tokenizer) -> str | None:
    """The special token the chat template closes a message with (ChatML: `<|im_end|>`)."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    probe = "autospec-probe-7f3a"
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": probe}], tokenize=False)
    except Exception:  # a template that needs other roles or variables: nothing to learn
        return None
    if probe not in text:
        return None
    after = text.split(probe, 1)[1]
    added = tokenizer.added_tokens_decoder.values()
    specials = {str(t) for t in added if getattr(t, "special", False)}
    specials |= set(tokenizer.all_special_tokens)
    specials = sorted(specials, key=len, reverse=True)  # longest first: `<|im_end|>` before `<|im`
    return next((t for t in specials if after.startswith(t)), None)


def convert_gguf(gguf_path: Path, out_dir: Path, *, quiet: bool = False,
                 log: Callable[[str], None] = lambda m: None) -> Path:
    """Convert any GGUF transformers can read into a plain HF checkpoint in `out_dir`:
    float32 safetensors, config without `quantization_config`, tokenizer with its chat template.

    float32, not bf16: Q4_1 de-quantizes to scale*q + min with fp16 scale and min, which needs
    more mantissa than bf16's 8 bits; float32 holds the GGUF's values exactly, and load_pair's
    default dtype is float32 anyway. The price is size (~540 MB for 135M parameters).
    """
    from tqdm.auto import tqdm
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    meta = read_gguf_metadata(gguf_path)
    where, name = str(gguf_path.parent), gguf_path.name
    bar = tqdm(total=3, desc=f"convert {name}", unit="stage", disable=quiet, file=sys.stderr)
    try:
        # 1. load: transformers de-quantizes every tensor to float32
        bar.set_postfix_str("load")
        try:
            tokenizer = AutoTokenizer.from_pretrained(where, gguf_file=name)
            with quiet_loading():  # our own bar above says which stage this is
                gguf_model = AutoModelForCausalLM.from_pretrained(where, gguf_file=name,
                                                                  dtype=torch.float32)
        except FetchError:
            raise
        except Exception as exc:  # transformers raises many kinds on a file it cannot map
            first = (str(exc).splitlines() or [""])[0]
            raise FetchError(f"could not load {gguf_path} with transformers: "
                             f"{type(exc).__name__}: {first}") from None
        if _split_digits(tokenizer, meta.get("tokenizer.ggml.pre")):
            log("tokenizer: digits split one by one, as llama.cpp's 'smollm' pre-tokenizer does")
        bar.update(1)

        # 2. copy: the loaded model is flagged as quantized and refuses save_pretrained; the
        # same weights in a fresh model of the same config save as ordinary safetensors.
        bar.set_postfix_str("copy")
        config_dict = gguf_model.config.to_dict()
        for key in ("quantization_config", "_name_or_path", "_model_name_or_path"):
            config_dict.pop(key, None)  # the last is the GGUF's `general.name`
        config = AutoConfig.for_model(**config_dict)
        # The chat template ends each turn with one special token; generation must stop there.
        # The GGUF's eos id normally is that token (SmolLM2: 2 = <|im_end|>); if a file says
        # otherwise, stop on both, end-of-turn first.
        eot = end_of_turn_token(tokenizer)
        eos = config.eos_token_id
        eos_ids = list(eos) if isinstance(eos, (list, tuple)) else [eos]
        if eot is not None:
            eot_id = tokenizer.convert_tokens_to_ids(eot)
            if eot_id not in eos_ids:
                log(f"config: eos_token_id {config.eos_token_id} is not the chat template's "
                    f"end of turn {eot!r} ({eot_id}); stopping on both")
                config.eos_token_id = [eot_id] + [i for i in eos_ids if i is not None]
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        missing, unexpected = model.load_state_dict(gguf_model.state_dict(), strict=False)
        missing = [k for k in missing if not (config.tie_word_embeddings and k == "lm_head.weight")]
        if missing or unexpected:
            raise FetchError(f"{gguf_path}: weights do not fit {type(model).__name__}: "
                             f"missing {missing[:3]}, unexpected {unexpected[:3]}")
        model.tie_weights()
        model.generation_config.eos_token_id = config.eos_token_id
        model.generation_config.pad_token_id = config.pad_token_id
        model.generation_config.bos_token_id = config.bos_token_id
        # the GGUF tokenizer knows no length limit (1e30); the model's positions are the limit
        if getattr(config, "max_position_embeddings", None):
            tokenizer.model_max_length = int(config.max_position_embeddings)
        del gguf_model
        bar.update(1)

        # 3. save
        bar.set_postfix_str("save")
        with writing(out_dir):
            out_dir.mkdir(parents=True, exist_ok=True)
            model.save_pretrained(out_dir)
            tokenizer.save_pretrained(out_dir)
        bar.update(1)
    finally:
        bar.close()
    return out_dir


# --- a GGUF's own blocks ----------------------------------------------------------------------

# a llama GGUF's tensor -> the HF module it is (blk.N. -> model.layers.N.)
_GGUF_NAMES = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
               "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
               "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}


def read_gguf_blocks(gguf_path: Path, heads: int, kv_heads: int,
                     warn=log.warning) -> dict[str, Int4Blocks]:
    """The 4-bit blocks of a llama GGUF's decoder layers, by HF module name. A layer tensor
    of another type is left out, with a warning (int4 quantizes it at load)."""
    from gguf import GGUFReader
    reader = GGUFReader(str(gguf_path))
    out: dict[str, Int4Blocks] = {}
    for tensor in reader.tensors:
        parts = tensor.name.split(".")
        if len(parts) != 4 or parts[0] != "blk" or parts[2] not in _GGUF_NAMES:
            continue
        hf = f"model.layers.{parts[1]}.{_GGUF_NAMES[parts[2]]}"
        kind = tensor.tensor_type.name
        if kind not in GGUF_INT4:
            warn(f"{tensor.name} is {kind}, not 4-bit blocks of {GROUP} (Q4_0 or Q4_1): "
                 f"int4 quantizes it at load from its float32 values")
            continue
        blocks = _gguf_blocks(np.asarray(tensor.data), kind)
        if parts[2] in ("attn_q", "attn_k"):  # llama.cpp's rotary order of Q's and K's rows
            blocks = _unpermute(blocks, heads if parts[2] == "attn_q" else kv_heads)
        out[hf] = blocks
    return out


def _gguf_blocks(raw: np.ndarray, kind: str) -> Int4Blocks:
    """(N, blocks * bytes) uint8 in ggml's layout: per block a float16 d, for Q4_1 a
    float16 m, then 16 bytes whose low nibbles are the block's values 0-15, high 16-31."""
    size, offset = GGUF_INT4[kind]
    n = raw.shape[0]
    per = raw.reshape(n, -1, size)
    d = torch.from_numpy(per[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32))
    start = 4 if offset else 2
    m = (torch.from_numpy(per[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32))
         if offset else None)
    nibbles = torch.from_numpy(per[..., start:start + 16].copy())
    q = torch.cat([nibbles & 0x0F, nibbles >> 4], -1).reshape(n, -1)
    zero = m + 8 * d if offset else torch.zeros_like(d)
    return Int4Blocks(q.contiguous(), d, zero)


def _unpermute(blocks: Int4Blocks, heads: int) -> Int4Blocks:
    """transformers' reverse of llama.cpp's Q/K row permutation, applied to whole rows."""
    def rows(t: torch.Tensor) -> torch.Tensor:
        n = t.shape[0]
        return t.reshape(heads, n // heads // 2, 2, *t.shape[1:]).transpose(1, 2).reshape(t.shape)
    return Int4Blocks(rows(blocks.q).contiguous(), rows(blocks.scale).contiguous(),
                      rows(blocks.zero).contiguous())
