"""`autospec generate`: stream one completion to stdout, its telemetry summary to stderr."""
from __future__ import annotations

import json
import sys

import click

from autospec.cli.options import draft_option, weights_option, load_engine, pair_option, target_option


@click.command()
@click.option("--prompt", required=True, help="Prompt text ('-' reads standard input).")
@click.option("--drafter", default="auto", show_default=True,
              help="auto: the adaptive controller picks drafter and K every step; a drafter's "
                   "name: that drafter at a fixed --k; none: plain decoding.")
@click.option("--k", "k", default=4, show_default=True, type=int,
              help="Tokens drafted per step with a named drafter.")
@click.option("--max-new-tokens", default=128, show_default=True, type=int)
@click.option("--temperature", default=0.0, show_default=True, type=float, help="0 = greedy.")
@click.option("--top-k", default=0, show_default=True, type=int)
@click.option("--top-p", default=1.0, show_default=True, type=float)
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--json", "as_json", is_flag=True, help="Telemetry summary as JSON on stderr.")
@click.option("--chat", is_flag=True,
              help="Send --prompt as one user message, rendered with the target's chat template.")
@pair_option
@target_option
@draft_option
@weights_option
def generate(prompt, drafter, k, max_new_tokens, temperature, top_k, top_p, seed, as_json,
             chat, pair, target, draft, weights):
    """Generate a completion with speculative decoding."""
    from autospec.drafters.base import known_drafters
    from autospec.engine.bandwidth import peak_bandwidth_gbs
    from autospec.engine.loop import AUTO
    if prompt == "-":
        prompt = sys.stdin.read()
    drafter = None if drafter == "none" else drafter
    if drafter not in (None, AUTO) and drafter not in known_drafters():
        raise click.BadParameter(f"unknown drafter '{drafter}' (known: auto, "
                                 f"{', '.join(known_drafters())}, none)", param_hint="--drafter")
    if drafter not in (None, AUTO) and k <= 0:
        raise click.BadParameter(f"k must be >= 1, got {k} (for plain decoding use --drafter none)",
                                 param_hint="--k")
    engine = load_engine(target, draft, weights, pair)
    if chat:
        from autospec.models.chat import encode_chat
        from autospec.models.pairs import not_a_chat_model
        refused = not_a_chat_model(engine.models.key)
        if refused:
            raise click.ClickException(f"--chat: {refused}")
        try:
            prompt = encode_chat(engine.models, [{"role": "user", "content": prompt}])
        except ValueError as exc:
            raise click.ClickException(str(exc)) from None
    from autospec.engine.textstream import TextStream
    text = TextStream(engine.models.tokenizer)

    def stream(tokens: list[int]) -> None:
        sys.stdout.write(text.add(tokens))
        sys.stdout.flush()

    try:
        out = engine.generate(prompt, drafter=drafter, k=k, max_new_tokens=max_new_tokens,
                              temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                              on_tokens=stream)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    sys.stdout.write(text.add([], final=True) + "\n")
    sys.stdout.flush()  # the text ends before the telemetry line on stderr starts
    t = out.telemetry
    if as_json:
        click.echo(json.dumps(t.to_dict(with_steps=False)), err=True)
    else:
        click.echo(
            f"[{_label(drafter, k, t)}] {t.output_tokens} tokens in "
            f"{t.wall_seconds:.2f}s ({t.tokens_per_s:.1f} tok/s), {t.steps} steps, acceptance "
            f"{t.acceptance_rate:.2f}, mean accepted length {t.mean_accepted_length:.2f}, "
            f"per position {[round(a, 2) for a in t.acceptance_per_position]}, "
            f"bandwidth {t.bandwidth_gbs:.2f} GB/s ({t.bandwidth_gbs / peak_bandwidth_gbs():.0%} "
            f"of peak), finish {t.finish_reason}", err=True)


def _label(drafter: str | None, k: int, telemetry) -> str:
    """What decoded: plain, DRAFTER k=K, or auto with the drafters' shares of its steps."""
    if drafter is None:
        return "plain"
    if drafter != "auto":
        return f"{drafter} k={k}"
    shares = sorted(telemetry.drafter_shares.items(), key=lambda kv: -kv[1])
    return "auto: " + ", ".join(f"{name} {share:.0%}" for name, share in shares)
