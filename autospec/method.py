"""A method — a way of decoding, as bench, replay, serve and tune spell it — parsed once.

On autospec's engine (`autospec bench`, replay, serve):

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

Inside vLLM (`autospec bench --engine vllm`; vllm/bench.py maps each to vLLM's
speculative_config), plain and adaptive[:POLICY.yaml] (autospec's proposer) too:

    vllm:ngram:K                 vLLM's own n-gram proposer, fixed K
    vllm:eagle:K                 the pair's feature head exported for vLLM
    vllm:dynamic:TABLE           vLLM's batch size -> K table over its n-gram proposer; TABLE
                                 as ctl:batch-table's
    ours:METHOD                  autospec's own engine running METHOD beside vLLM

`parse_method` turns the text into a frozen `Method`; everything after reads its fields.
`FORMS` says which engine runs each kind; `parse_methods` refuses, naming the engine that runs
it, a method the engine asked for cannot run.
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
AUTOSPEC, VLLM = "autospec", "vllm"  # the engines, as `autospec bench --engine` names them
FORMS = {  # kind: (its forms as written, the engines that run it)
    "plain": (("plain",), (AUTOSPEC, VLLM)),
    "static": (("static:DRAFTER:K",), (AUTOSPEC,)),
    "adaptive": (("adaptive", "adaptive:POLICY.yaml"), (AUTOSPEC, VLLM)),
    "ctl": (("ctl:fixed[:DRAFTER:K]", "ctl:hf-heuristic[:DRAFTER]", "ctl:ema[:DRAFTER]",
             "ctl:batch-table[:DRAFTER[:TABLE]]"), (AUTOSPEC,)),
    "hf": (("hf:generate", "hf:assisted[:K]", "hf:prompt-lookup[:K]", "hf:early-exit[:K]"),
           (AUTOSPEC,)),
    "llamacpp": (("llamacpp:plain", "llamacpp:prompt-lookup[:K]"), (AUTOSPEC,)),
    "oracle": (ORACLES, (AUTOSPEC,)),
    "vllm": (("vllm:ngram:K", "vllm:eagle:K", "vllm:dynamic:TABLE"), (VLLM,)),
    "ours": (("ours:METHOD",), (VLLM,)),
}
KNOWN = ", ".join(form for forms, _ in FORMS.values() for form in forms)


def known(engine: str) -> str:
    """The forms `engine` runs, comma-separated (the CLI's help, the refusals)."""
    return ", ".join(form for forms, engines in FORMS.values() if engine in engines for form in forms)


@dataclass(frozen=True)
class Method:
    spec: str  # as written: the key in bench's JSON and serve's responses
    kind: str  # a key of FORMS: "plain" | "static" | "adaptive" | "ctl" | "hf" | "llamacpp" |
    #            "oracle" | "vllm" | "ours"
    drafter: str | None = None  # static, ctl; vllm: vLLM's proposer, "ngram" | "eagle"
    k: int | None = None  # static, ctl:fixed, hf, llamacpp, vllm:ngram|eagle (draft tokens per step)
    baseline: str | None = None  # ctl: fixed | hf-heuristic | ema; hf: generate | assisted |
    #                              prompt-lookup | early-exit; oracle: oracle | oracle-per-category
    policy_path: str | None = None  # adaptive:POLICY.yaml
    table: tuple[tuple[int, int], ...] | None = None  # ctl:batch-table, vllm:dynamic: (batch
    #                                                   size, K), sizes up
    inner: Method | None = None  # ours:METHOD: the METHOD autospec's engine runs
    settings: object = field(default=None, compare=False, repr=False)  # its ControllerSettings

    def __str__(self) -> str:
        return self.spec

    @property
    def is_controller(self) -> bool:
        """Runs through autospec's own engine loop with a Controller (not hf:, llamacpp:,
        oracle, vllm: or ours:)."""
        return self.kind in ("plain", "static", "adaptive", "ctl")

    @property
    def engines(self) -> tuple[str, ...]:
        """The engines that run it (FORMS)."""
        return FORMS[self.kind][1]

    @property
    def needs_drafters(self) -> tuple[str, ...]:
        """Drafters of ours this method cannot run without (adaptive picks among what is
        there; vLLM's proposers are vLLM's)."""
        if self.kind == "ours":
            return self.inner.needs_drafters
        if self.kind in ("static", "ctl"):
            return (self.drafter,)
        if self.kind == "hf" and self.baseline == "assisted":
            return ("draft-model",)
        return ()


def kind_of(text: str) -> str:
    """The kind (a key of FORMS) a method's text names, as written or as a report keys it
    (METHOD@FORMAT), reading no file (a policy's); "" where it names none."""
    head = text.split("@", 1)[0].split(":", 1)[0]
    return head if head in FORMS else ""


def is_adaptive(text: str) -> bool:
    """Whether `text` names the online controller: `adaptive` or `adaptive:POLICY.yaml`. Every
    other method fixes the drafter and K (plain, static:) or runs a baseline (ctl:, hf:)."""
    return kind_of(text) == "adaptive"


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
    if parts[0] == "vllm" and len(parts) == 3 and parts[1] in ("ngram", "eagle"):
        return Method(text, "vllm", parts[1], _k(parts[2], text))
    if parts[0] == "vllm" and len(parts) == 3 and parts[1] == "dynamic":
        return Method(text, "vllm", "ngram", table=_table(parts[2], text))
    if parts[0] == "ours" and len(parts) > 1:
        inner = parse_method(text[len("ours:"):])
        if AUTOSPEC not in inner.engines:
            raise ValueError(f"method '{text}': ours:METHOD runs METHOD on autospec's engine, "
                             f"and '{inner}' runs inside vLLM only")
        return Method(text, "ours", inner=inner)
    raise ValueError(f"unknown method '{text}' (known: {KNOWN})")


def parse_methods(spec: str, engine: str = AUTOSPEC) -> list[Method]:
    """A comma-separated list, each parsed once and run by `engine` (check_engine); `plain`
    first (every speedup is measured against it, in the same run); duplicates dropped."""
    texts = list(dict.fromkeys(m.strip() for m in spec.split(",") if m.strip()))
    if not texts:
        raise ValueError("no methods given")
    methods = [check_engine(parse_method(t), engine) for t in texts]
    if "plain" not in texts:
        methods.insert(0, parse_method("plain"))
    return methods


def check_engine(method: Method, engine: str) -> Method:
    """`method` if `engine` runs it; else ValueError naming the engine that does."""
    if engine in method.engines:
        return method
    if method.kind == "ours":
        raise ValueError(f"method '{method}' runs beside vLLM only (autospec bench --engine "
                         f"vllm); on autospec's engine alone, give '{method.inner}'")
    if engine == VLLM:
        raise ValueError(f"method '{method}' runs on autospec's engine, not inside vLLM: give "
                         f"'ours:{method}' to run it beside vLLM, or --engine autospec "
                         f"(--engine vllm runs: {known(VLLM)})")
    raise ValueError(f"method '{method}' runs inside vLLM only (autospec bench --engine vllm; "
                     f"--engine {engine} runs: {known(engine)})")


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
