"""A method — a way of decoding, as bench, replay, serve and tune spell it — parsed once.

    plain                        the target alone (K = 0)
    static:DRAFTER:K             one drafter, fixed K
    adaptive                     the online controller on its defaults
    adaptive:POLICY.yaml         the same with a policy file's settings (read and checked here)
    ctl:fixed[:DRAFTER:K]        baseline controllers (controller/baselines.py); DRAFTER
    ctl:hf-heuristic[:DRAFTER]   defaults to draft-model, fixed's K to 4
    ctl:ema[:DRAFTER]
    ctl:batch-table[:DRAFTER[:TABLE]]   batch size -> K, K = 0 above the table's largest size;
                                 TABLE is SIZE=K/SIZE=K/..., e.g. 1=4/4=2/8=1 (the default:
                                 controller/baselines.py DEFAULT_BATCH_TABLE)
    hf:generate                  transformers' own generate() (bench only)
    hf:assisted[:K], hf:prompt-lookup[:K], hf:early-exit[:K]   its assisted generation, K = 4
    llamacpp:plain, llamacpp:prompt-lookup[:K]   llama.cpp on the pair's GGUF (bench only;
                                 bench/llamacpp.py), K = 4
    oracle, oracle-per-category  picked afterwards from a bench run's static methods

`parse_method` turns the text into a frozen `Method`; everything after reads its fields.
`is_adaptive` reads one thing from the text alone, opening no policy file: whether a method
string (one stored in telemetry, say, from another machine) names the online controller.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

CTL_DEFAULT_DRAFTER = "draft-model"
CTL_FIXED_K = 4
HF_DEFAULT_K = 4
_CTL = ("fixed", "hf-heuristic", "ema", "batch-table")
_HF = ("generate", "assisted", "prompt-lookup", "early-exit")
ORACLES = ("oracle", "oracle-per-category")
KNOWN = ("plain, static:DRAFTER:K, adaptive, adaptive:POLICY.yaml, ctl:fixed[:DRAFTER:K], "
         "ctl:hf-heuristic[:DRAFTER], ctl:ema[:DRAFTER], ctl:batch-table[:DRAFTER[:TABLE]], "
         "hf:generate, hf:assisted[:K], hf:prompt-lookup[:K], hf:early-exit[:K], "
         "llamacpp:plain, llamacpp:prompt-lookup[:K], oracle, oracle-per-category")


@dataclass(frozen=True)
class Method:
    spec: str  # as written: the key in bench's JSON and serve's responses
    kind: str  # "plain" | "static" | "adaptive" | "ctl" | "hf" | "llamacpp" | "oracle"
    drafter: str | None = None  # static, ctl
    k: int | None = None  # static, ctl:fixed, hf (draft tokens per step)
    baseline: str | None = None  # ctl: fixed | hf-heuristic | ema; hf: generate | assisted |
    #                              prompt-lookup | early-exit; oracle: oracle | oracle-per-category
    policy_path: str | None = None  # adaptive:POLICY.yaml
    table: tuple[tuple[int, int], ...] | None = None  # ctl:batch-table: (batch size, K), sizes up
    settings: object = field(default=None, compare=False, repr=False)  # its ControllerSettings

    def __str__(self) -> str:
        return self.spec

    @property
    def is_controller(self) -> bool:
        """Runs through autospec's own engine loop with a Controller (not hf:, not oracle)."""
        return self.kind in ("plain", "static", "adaptive", "ctl")

    @property
    def needs_drafters(self) -> tuple[str, ...]:
        """Drafters this method cannot run without (adaptive picks among what is there)."""
        if self.kind in ("static", "ctl"):
            return (self.drafter,)
        if self.kind == "hf" and self.baseline == "assisted":
            return ("draft-model",)
        return ()


def is_adaptive(text: str) -> bool:
    """Whether `text` names the online controller: `adaptive` or `adaptive:POLICY.yaml`. Every
    other method fixes the drafter and K (plain, static:) or runs a baseline (ctl:, hf:)."""
    return text.split(":", 1)[0] == "adaptive"


def parse_method(text: str) -> Method:
    """A Method from its text; ValueError naming the method and what is accepted."""
    from autospec.drafters.base import known_drafters
    if not isinstance(text, str):
        raise ValueError(f"unknown method {text!r} (known: {KNOWN})")
    parts = text.split(":")
    if text == "plain":
        return Method(text, "plain")
    if text in ORACLES:
        return Method(text, "oracle", baseline=text)
    if text == "adaptive":
        return Method(text, "adaptive")
    if is_adaptive(text):
        from autospec.policy import PolicyError, load_policy
        path = text[len("adaptive:"):]
        try:
            settings = load_policy(path).to_settings()
        except PolicyError as exc:
            raise ValueError(f"method '{text}': {exc}") from None
        return Method(text, "adaptive", policy_path=str(Path(path)), settings=settings)
    if parts[0] == "static" and len(parts) == 3:
        return Method(text, "static", _drafter(parts[1], text, known_drafters()), _k(parts[2], text))
    if parts[0] == "ctl" and len(parts) >= 2 and parts[1] in _CTL:
        if len(parts) > 2:
            _drafter(parts[2], text, known_drafters())
        drafter = parts[2] if len(parts) > 2 else CTL_DEFAULT_DRAFTER
        if parts[1] == "fixed" and len(parts) <= 4:
            k = _k(parts[3], text) if len(parts) == 4 else CTL_FIXED_K
            return Method(text, "ctl", drafter, k, baseline="fixed")
        if parts[1] == "batch-table" and len(parts) <= 4:
            table = _table(parts[3], text) if len(parts) == 4 else None
            return Method(text, "ctl", drafter, baseline=parts[1], table=table)
        if parts[1] not in ("fixed", "batch-table") and len(parts) <= 3:
            return Method(text, "ctl", drafter, baseline=parts[1])
    if text == "hf:generate":
        return Method(text, "hf", baseline="generate")
    if parts[0] == "hf" and len(parts) in (2, 3) and parts[1] in _HF[1:]:
        k = _k(parts[2], text) if len(parts) == 3 else HF_DEFAULT_K
        return Method(text, "hf", k=k, baseline=parts[1])
    if text == "llamacpp:plain":
        return Method(text, "llamacpp", baseline="plain")
    if parts[0] == "llamacpp" and len(parts) in (2, 3) and parts[1] == "prompt-lookup":
        k = _k(parts[2], text) if len(parts) == 3 else HF_DEFAULT_K
        return Method(text, "llamacpp", k=k, baseline="prompt-lookup")
    raise ValueError(f"unknown method '{text}' (known: {KNOWN})")


def parse_methods(spec: str) -> list[Method]:
    """A comma-separated list, each parsed once; `plain` first (every speedup is measured
    against it, in the same run); duplicates dropped."""
    texts = list(dict.fromkeys(m.strip() for m in spec.split(",") if m.strip()))
    if not texts:
        raise ValueError("no methods given")
    methods = [parse_method(t) for t in texts]
    if "plain" not in texts:
        methods.insert(0, parse_method("plain"))
    return methods


def _drafter(name: str, method: str, known) -> str:
    if name not in known:
        raise ValueError(f"unknown drafter '{name}' in method '{method}' (known: {', '.join(known)})")
    return name


def _k(text: str, method: str) -> int:
    try:
        k = int(text)
    except ValueError:
        raise ValueError(f"K must be an integer in method '{method}', got '{text}'") from None
    if k <= 0:
        raise ValueError(f"K must be >= 1 in method '{method}', got {k}")
    return k


def _table(text: str, method: str) -> tuple[tuple[int, int], ...]:
    """SIZE=K/SIZE=K/... -> ((size, k), ...) by size: sizes >= 1, distinct; K >= 0."""
    entries = []
    for entry in text.split("/"):
        size, _, k = entry.partition("=")
        try:
            size, k = int(size), int(k)
        except ValueError:
            raise ValueError(f"batch table entry '{entry}' in method '{method}' is not SIZE=K "
                             f"(e.g. 1=4/4=2/8=1)") from None
        if size < 1 or k < 0:
            raise ValueError(f"batch table entry '{entry}' in method '{method}': SIZE must be "
                             f">= 1 and K >= 0")
        entries.append((size, k))
    sizes = [size for size, _ in entries]
    if len(set(sizes)) != len(sizes):
        raise ValueError(f"batch table in method '{method}' lists a batch size twice")
    return tuple(sorted(entries))
