"""Loading a target (and optionally a draft model) that share one tokenizer.

Any AutoModelForCausalLM works: a local path, or a hub id when the hub is reachable. With no
paths, the reference pair shipped in the package is used (built on first use if absent).
Pairs by name (reference, smollm2): autospec/models/pairs.py.
"""
from __future__ import annotations

import copy
import logging
import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import torch
from torch import nn

from autospec.models import ModelLoadError
from autospec.models import weights as formats
from autospec.models.pairs import named_pair, pair_name_for
from autospec.models.shared_draft import borrowed_layers, is_shared_draft, load_shared_draft
from autospec.paths import REFERENCE_DIR

log = logging.getLogger("autospec.models")

PROBE_TEXT = "def probe(x):\n    return x + 1  # tokenizer probe: ünïcode, tabs\t, 12345\n"


def pair_key(target: str, draft: str | None) -> str:
    """The one model-pair key — serve's telemetry, the daemon's learners, the store's rows,
    traces, tune's provenance, the report: a named pair's name ("reference", "smollm2"; see
    autospec/models/pairs.py), else TARGET+DRAFT (TARGET alone without a draft model)."""
    name = pair_name_for(target, draft)
    if name:
        return name
    return f"{target}+{draft}" if draft else target


@dataclass
class ModelPair:
    """The models one engine serves: the target, an optional draft model, their tokenizer."""
    target: nn.Module
    tokenizer: object
    draft: nn.Module | None = None
    target_name: str = "target"
    draft_name: str | None = None
    # a trained early exit (models/shared_draft.py: the target's first L layers + a trained
    # exit); the early-exit drafter at its depth L runs it instead of the bare view
    exit_model: nn.Module | None = None
    # a feature-level draft head (models/eagle_head.py): the engine then keeps the target's
    # last hidden states beside its KV cache, for the `eagle` drafter
    eagle: nn.Module | None = None
    _exit_views: dict = field(default_factory=dict, repr=False)  # depth -> early-exit model
    # the registered drafters it can run, found once (drafters/base.py runnable_drafters)
    runnable: tuple[str, ...] | None = field(default=None, repr=False)

    def __post_init__(self):
        if self.exit_model is not None:  # at its depth, the trained exit is the view
            self._exit_views[borrowed_layers(self.exit_model)] = self.exit_model

    @property
    def key(self) -> str:
        """The model-pair key (see pair_key)."""
        return pair_key(self.target_name, self.draft_name)

    @property
    def max_positions(self) -> int:
        cfg = self.target.config
        return int(getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", 2048))

    @property
    def eos_ids(self) -> set[int]:
        eos = self.target.config.eos_token_id
        ids = set(eos if isinstance(eos, (list, tuple)) else [eos]) if eos is not None else set()
        if self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        return ids

    @property
    def default_exit_layer(self) -> int:
        if self.exit_model is not None:
            return borrowed_layers(self.exit_model)
        cfg = self.target.config
        return int(getattr(cfg, "autospec_exit_layer", 0) or max(1, cfg.num_hidden_layers // 4))

    def early_exit_view(self, layer: int) -> nn.Module:
        """The target's first `layer` decoder layers + its final norm and head, weights shared;
        at the trained exit's depth, the trained exit."""
        if layer not in self._exit_views:
            self._exit_views[layer] = early_exit_view(self.target, layer)
        return self._exit_views[layer]


def weight_bytes(model: nn.Module) -> int:
    """Bytes of weights one forward of one token reads, as their format stores them (int4:
    models/weights.py): all of them, except an input embedding that is not also the output
    head (a look-up reads one row of it)."""
    total = formats.stored_bytes(model)
    embedding, head = model.get_input_embeddings(), model.get_output_embeddings()
    if embedding is not None and getattr(head, "weight", None) is not embedding.weight:
        total -= embedding.weight.numel() * embedding.weight.element_size()
    return total


def early_exit_view(target: nn.Module, layer: int) -> nn.Module:
    """A model object over the target's own modules that stops after `layer` decoder layers.

    Built on the meta device and then pointed at the target's submodules, so it costs no
    memory and runs transformers' own forward (masks, rotary embeddings, cache) unchanged.
    """
    n_layers = target.config.num_hidden_layers
    if not 1 <= layer < n_layers:
        raise ValueError(f"exit layer {layer} out of range (1..{n_layers - 1} for this target)")
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = layer
    with torch.device("meta"):
        view = type(target)(config)
    base_name = target.base_model_prefix
    base, view_base = getattr(target, base_name), getattr(view, base_name)
    for name, child in base.named_children():
        if isinstance(child, nn.ModuleList) and len(child) == n_layers:
            child = nn.ModuleList(list(child)[:layer])
        setattr(view_base, name, child)
    for name, child in target.named_children():
        if name != base_name:
            setattr(view, name, child)
    leftovers = [n for n, t in list(view.named_parameters()) + list(view.named_buffers()) if t.is_meta]
    if leftovers:
        raise ModelLoadError(f"early exit is not supported for {type(target).__name__} "
                             f"(unshared tensors: {leftovers[:3]})")
    return view.eval()


@contextmanager
def quiet_loading() -> Iterator[None]:
    """transformers 5 draws a "Loading weights" tqdm bar for every model it loads: two per
    `autospec generate`, one per serve or bench start, none of them news. Only the bars go
    (their switch is process-wide, so it is restored after); transformers' warnings stay."""
    from transformers.utils import logging as hf_logging
    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def _load_model(path: str, dtype: torch.dtype, role: str) -> nn.Module:
    from transformers import AutoModelForCausalLM
    if not (Path(path).is_dir() or _looks_like_hub_id(path)):
        raise ModelLoadError(f"{role} model path '{path}' does not exist")
    try:
        with quiet_loading():
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot load {role} model '{path}': {exc}") from None
    return model.eval()


def _looks_like_hub_id(path: str) -> bool:
    return not os.path.isabs(path) and path.count("/") == 1 and not path.startswith(".")


def check_same_tokenizer(target_tok, draft_tok, target_name: str, draft_name: str) -> None:
    """Refuse a draft whose tokenizer differs from the target's: vocab size and a probe."""
    if len(target_tok) != len(draft_tok):
        raise ModelLoadError(
            f"draft model '{draft_name}' has another tokenizer than target '{target_name}': "
            f"vocab size {len(draft_tok)} vs {len(target_tok)}")
    if target_tok.encode(PROBE_TEXT) != draft_tok.encode(PROBE_TEXT):
        raise ModelLoadError(
            f"draft model '{draft_name}' has another tokenizer than target '{target_name}': "
            f"the probe text encodes differently")


def load_pair(target: str | None = None, draft: str | None = None,
              weights: str = "auto", with_draft: bool = True,
              exit: str | None = None, eagle: str | None = None) -> ModelPair:
    """Load target + draft (defaults: the shipped reference pair) at weight format `weights`
    (models/weights.py; auto: the target's own), the same for every model of the pair: each is
    read in float32, then converted; a GGUF pair's int4 is its own 4-bit blocks (BLOCKS_FILE in
    the target's folder). Speculative output is plain decoding's at the same format, but at a
    near-tie (models/ties.py)."""
    from transformers import AutoTokenizer
    if target is None:
        target = str(ensure_reference() / "target")
        if draft is None and with_draft:
            draft = str(REFERENCE_DIR / "draft")
    try:
        weights = formats.resolve(weights, target)
    except formats.FormatError as exc:
        raise ModelLoadError(str(exc)) from None
    torch_dtype = torch.float32
    target_model = _load_model(target, torch_dtype, "target")
    tokenizer = AutoTokenizer.from_pretrained(target)
    draft_model = None
    if draft is not None:
        if is_shared_draft(draft):  # borrows the target's embedding (models/shared_draft.py)
            draft_model = _load_shared(draft, target_model, torch_dtype, "draft model")
        else:
            draft_model = _load_model(draft, torch_dtype, "draft")
        try:
            draft_tok = AutoTokenizer.from_pretrained(draft)
        except (OSError, ValueError):
            draft_tok = None
        if draft_tok is not None:
            check_same_tokenizer(tokenizer, draft_tok, target, draft)
        elif draft_model.config.vocab_size != target_model.config.vocab_size:
            raise ModelLoadError(
                f"draft model '{draft}' has another vocabulary than target '{target}': "
                f"{draft_model.config.vocab_size} vs {target_model.config.vocab_size}")
    exit_model = _load_shared(exit, target_model, torch_dtype, "trained exit") if exit else None
    eagle_model = (_load_shared(eagle, target_model, torch_dtype, "feature head", head=True)
                   if eagle else None)
    _to_format(weights, target, target_model, draft_model, exit_model, eagle_model)
    # imported where used, as below: forward's model code costs ~3 s to import, build's ~4 s,
    # and a process that only fetches or names pairs needs neither
    from autospec.models.forward import prepare_compiled
    # before any step (models/compiled.py)
    prepare_compiled(target_model, draft_model, exit_model, head=eagle_model)
    return ModelPair(target_model, tokenizer, draft_model, target, draft, exit_model, eagle_model)


def load_named_pair(name: str, weights: str = "auto") -> ModelPair:
    """The ModelPair a name stands for (models/pairs.py's table)."""
    spec = named_pair(name)
    target, draft = spec.locate()
    exit_dir, eagle_dir = spec.exit_dir(), spec.eagle_dir()
    return load_pair(str(target), str(draft) if draft else None, weights,
                     exit=str(exit_dir) if exit_dir else None,
                     eagle=str(eagle_dir) if eagle_dir else None)


def _to_format(weights: str, target: str, target_model: nn.Module, *others) -> None:
    """Every model of a pair at `weights`, the target first (the others borrow its tensors)."""
    if weights == "float32":
        return
    slow = formats.warn_if_slow(weights)
    if slow:
        log.warning(slow)
    blocks = None
    kept = Path(target) / formats.BLOCKS_FILE
    if weights == "int4" and kept.is_file():
        blocks = formats.load_blocks(kept)
    try:
        formats.apply(target_model, weights, blocks)
        for model in others:
            if model is not None:
                formats.apply(model, weights)
    except formats.FormatError as exc:
        raise ModelLoadError(str(exc)) from None


def _load_shared(path: str, target_model: nn.Module, dtype: torch.dtype, role: str,
                 head: bool = False) -> nn.Module:
    """A model that borrows the target's tensors: a shared draft or trained exit
    (models/shared_draft.py), or with `head` a feature head (models/eagle_head.py)."""
    from autospec.models import eagle_head
    made_for_target = eagle_head.is_eagle_head(path) if head else is_shared_draft(path)
    if not made_for_target:
        key = eagle_head.CONFIG_KEY if head else "autospec_draft"
        raise ModelLoadError(f"{role} '{path}' is not a {'head' if head else 'draft'} made for "
                             f"a target (no {key} in its config.json)")
    load = eagle_head.load_eagle_head if head else load_shared_draft
    try:
        return load(path, target_model, dtype)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot load {role} '{path}': {exc}") from None


def ensure_reference() -> Path:
    """The shipped pair; built (long!) on first use if this install lacks it."""
    if not (REFERENCE_DIR / "target" / "config.json").exists():
        from autospec.models.build import build
        build("reference")
    return REFERENCE_DIR
