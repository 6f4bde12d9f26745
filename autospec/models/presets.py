"""Model-pair recipes. One preset = one reproducible build (seeded, step-counted, not timed)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ModelShape:
    layers: int
    hidden: int
    heads: int
    ffn: int


@dataclass(frozen=True)
class TrainRecipe:
    steps: int
    batch: int  # sequences per step
    seq_len: int
    lr: float
    warmup: int
    copy_share: float  # share of sequences whose second half copies a span of the first
    exit_layers: tuple[int, ...] = ()  # LayerSkip-style auxiliary exits (1-based layer counts)
    exit_weight: float = 0.0  # weight of each auxiliary exit's loss
    # share of rows that repeat a run of random tokens: only in-context copying (an induction
    # head) lowers their loss, so they make one form in tens of steps where code copies alone
    # did not in thousands (model card, "Variants tried for copying")
    random_share: float = 0.0
    schedule: str = "cosine"  # "cosine" (to 10 % over schedule_steps) or "constant" after warm-up
    schedule_steps: int | None = None  # the cosine's length when a stage stops before its end
    data_seed: int | None = None  # batches are drawn from rng([data_seed or the build seed, step])
    distill: float = 0.0  # weight of KL(teacher || model) against the CE (the draft's stages)


@dataclass(frozen=True)
class Preset:
    name: str
    vocab_size: int
    max_positions: int
    target: ModelShape
    draft: ModelShape
    target_recipe: TrainRecipe
    draft_recipe: TrainRecipe
    exit_layer: int  # the early-exit drafter's default depth
    # further stages, each continuing from the one before (fresh optimizer, own checkpoint)
    target_stages: tuple[TrainRecipe, ...] = ()
    draft_stages: tuple[TrainRecipe, ...] = ()  # distilled from the finished target
    seed: int = 0
    max_corpus_files: int | None = None  # tiny trains on a slice of the corpus
    tokenizer_files: int | None = None
    notes: dict = field(default_factory=dict)
    # the tokenizer's chat template (None: none, a chat is refused with a clear error)
    chat_template: str | None = None


# The reference pair's chat template: the messages' contents, one after another, each ending
# in a newline, no role markers. Its target continues code and prose and was never taught a
# dialogue format, so a chat is a prompt: `/v1/chat/completions` and `generate --chat` answer
# on the default pair (a user message "def add(a, b):" gets its body), as a base model would.
RAW_CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}\n{% endfor %}"


PRESETS = {
    # Seconds to build: for tests that need a freshly trained pair. Weights are poor; the
    # engine is lossless for any weights, which is what those tests check.
    "tiny": Preset(
        name="tiny",
        vocab_size=384,
        max_positions=2048,
        target=ModelShape(layers=2, hidden=64, heads=2, ffn=128),
        draft=ModelShape(layers=1, hidden=32, heads=2, ffn=64),
        target_recipe=TrainRecipe(steps=60, batch=8, seq_len=64, lr=3e-3, warmup=5,
                                  copy_share=0.3, exit_layers=(1,), exit_weight=0.3),
        draft_recipe=TrainRecipe(steps=60, batch=8, seq_len=64, lr=3e-3, warmup=5, copy_share=0.3),
        # one short stage each, so that builds in tests run the staged path the reference uses
        target_stages=(TrainRecipe(steps=10, batch=4, seq_len=64, lr=3e-3, warmup=2,
                                   copy_share=0.5, random_share=0.5, exit_layers=(1,),
                                   exit_weight=0.3, schedule="constant"),),
        draft_stages=(TrainRecipe(steps=10, batch=4, seq_len=64, lr=3e-3, warmup=2,
                                  copy_share=0.5, random_share=0.5, distill=0.5),),
        exit_layer=1,
        max_corpus_files=40,
        tokenizer_files=40,
    ),
    # The shipped pair. About 60 minutes of 2-core CPU for the target and 8 for the draft.
    "reference": Preset(
        name="reference",
        chat_template=RAW_CHAT_TEMPLATE,
        vocab_size=4096,
        max_positions=1024,
        target=ModelShape(layers=8, hidden=320, heads=5, ffn=864),
        draft=ModelShape(layers=2, hidden=128, heads=2, ffn=384),
        target_recipe=TrainRecipe(steps=2000, batch=16, seq_len=256, lr=1.5e-3, warmup=150,
                                  copy_share=0.3, exit_layers=(2, 4), exit_weight=0.25),
        draft_recipe=TrainRecipe(steps=2500, batch=16, seq_len=256, lr=2e-3, warmup=100,
                                 copy_share=0.3),
        # the draft relearnt against the copying target: its outputs distilled, same data mix
        draft_stages=(
            TrainRecipe(steps=300, batch=8, seq_len=512, lr=1e-3, warmup=20, copy_share=0.6,
                        random_share=0.35, distill=0.5, data_seed=17),
        ),
        # Copying: the main recipe's target did not copy (0.29); these stages teach it.
        target_stages=(
            # 1. more and longer copies: no phase change by itself (stopped at 800 of 1500)
            TrainRecipe(steps=800, batch=16, seq_len=384, lr=8e-4, warmup=50, copy_share=0.7,
                        exit_layers=(2, 4), exit_weight=0.25, schedule_steps=1500, data_seed=7),
            # 2. random-token repeats: the induction phase change within ~100 steps; 512 tokens
            #    so that copies reach across the whole of a long prompt
            TrainRecipe(steps=1200, batch=8, seq_len=512, lr=1e-3, warmup=30, copy_share=0.6,
                        random_share=0.35, exit_layers=(2, 4), exit_weight=0.25,
                        schedule="constant", data_seed=11),
            # 3. the same mix, the learning rate decayed
            TrainRecipe(steps=200, batch=8, seq_len=512, lr=1e-3, warmup=1, copy_share=0.6,
                        random_share=0.35, exit_layers=(2, 4), exit_weight=0.25, data_seed=13),
        ),
        exit_layer=2,
        notes={"history": "the shipped target's first 1100 steps ran under a 3000-step "
                          "schedule (lr 0.74x peak at step 1100); the build was then cut to "
                          "2000 steps to fit the session and resumed from that checkpoint "
                          "(lr 0.53x peak at step 1100, cosine to 10 % at 2000). A fresh "
                          "build of this preset differs from the shipped pair in that respect. "
                          "Target stages 1-3 ran first as experiment scripts with these recipes "
                          "and data seeds (the code then moved into train.py) and their "
                          "checkpoints were placed in the build cache; the card's training "
                          "time counts stage 3 (889 s, the CPU shared with other work) but "
                          "not stages 1 and 2 (about 1900 s and 2355 s)."},
    ),
}


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset '{name}' (known: {', '.join(sorted(PRESETS))})") from None
