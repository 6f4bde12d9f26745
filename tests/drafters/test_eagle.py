"""The feature-level drafter (`eagle`): the features the engine hands over, heads whose
behaviour is known by construction, losslessness, and the head's files."""
import pytest
import torch

from autospec.drafters.base import runnable_drafters
from autospec.engine.loop import Engine
from autospec.controller.interface import StaticController
from autospec.engine.request import Job
from autospec.models.eagle_head import EagleHead, load_eagle_head, save_eagle_head
from autospec.models import ModelLoadError
from autospec.models.pair import ModelPair, load_pair
from conftest import KS, IdTokenizer, assert_lossless, counting_llama, random_llama

VOCAB = 12


def counting_pair(uses: str) -> ModelPair:
    """counting_llama (greedy next token = current + 1; its last hidden state at t is
    4 * onehot(x_t), the layers adding nothing) with a head that predicts f_{t+1} exactly:
    - "embedding": from the embedding of x_{t+1} alone (fc = [I | 0]);
    - "feature": from the handed-over f_t alone, shifted by one token (fc = [0 | R]), so a
      feature off by one position, or stale after a roll-back, drafts the wrong token."""
    target = counting_llama(VOCAB)
    head = EagleHead(target, torch.arange(VOCAB))
    width = target.config.hidden_size
    shift = torch.zeros(width, width)
    for j in range(VOCAB):  # dim j (token j) -> dim j + 1 (token j + 1)
        shift[(j + 1) % VOCAB, j] = 1.0
    with torch.no_grad():
        zero = torch.zeros(width, width)
        if uses == "embedding":
            head.fc.weight.copy_(torch.cat([torch.eye(width), zero], 1))
        else:
            head.fc.weight.copy_(torch.cat([zero, shift / 4], 1))  # f_t = 4 onehot
    return ModelPair(target, IdTokenizer(), eagle=head.eval())


@pytest.mark.parametrize("uses", ["embedding", "feature"])
def test_a_head_that_predicts_the_true_feature_has_every_draft_accepted(uses):
    engine = Engine(counting_pair(uses), max_batch=3)
    prompts = [[0, 1, 2], [5, 6], [3, 4, 5, 6, 7, 8, 9]]
    out = engine.run([Job(p, 30) for p in prompts], StaticController("eagle", 4))
    for prompt, generation in zip(prompts, out):
        assert generation.token_ids == [(prompt[-1] + 1 + i) % VOCAB for i in range(30)]
        steps = generation.telemetry
        assert steps.acceptance_rate == 1.0, steps.acceptance_per_position


def test_a_head_fed_features_one_position_late_fails():
    """The by-construction test has teeth: handing the head f_{t-1} instead of f_t (an
    off-by-one in the engine) drafts a token behind, and no draft is accepted."""
    pair = counting_pair("feature")
    engine = Engine(pair)
    real = engine.cache.hidden_of
    engine.cache.hidden_of = lambda slot: (None if slot is None else
                                           torch.cat([real(slot)[:1], real(slot)[:-1]]))
    out = engine.generate([0, 1, 2], controller=StaticController("eagle", 4), max_new_tokens=12)
    assert out.telemetry.acceptance_rate == 0.0


def test_features_kept_beside_the_cache_equal_a_fresh_forward(reference_pair):
    """After steps with rejections, in a batch of rows drafting differently, every row's kept
    features equal the target's last hidden states over its tokens (no stale entry)."""
    torch.manual_seed(0)
    head = EagleHead(reference_pair.target, torch.arange(reference_pair.target.config.vocab_size))
    pair = ModelPair(reference_pair.target, reference_pair.tokenizer, reference_pair.draft,
                     eagle=head.eval())
    engine = Engine(pair, max_batch=3, max_len=256)
    prompts = ["def add(a, b):\n    return", "import os\nimport", "class Foo:\n    def"]
    requests = [engine.start(p, 20) for p in prompts]
    plan = [StaticController("eagle", 3), StaticController("ngram", 4), StaticController(None, 0)]
    for _ in range(6):
        engine.advance(list(zip(requests, plan)))
    assert sum(s.proposed - s.accepted for r in requests for s in r.steps) > 0  # rejections
    for request in requests:
        kept = engine.cache.hidden_of(request.slot)
        with torch.no_grad():
            fresh = pair.target(torch.tensor([request.tokens[:-1]]),
                                output_hidden_states=True).hidden_states[-1][0]
        assert kept.shape == fresh.shape
        assert torch.allclose(kept, fresh, atol=1e-4), (kept - fresh).abs().max()


@pytest.mark.parametrize("k", KS)
def test_greedy_identical_with_an_untrained_head(reference_pair, k):
    torch.manual_seed(k)
    head = EagleHead(reference_pair.target, torch.arange(reference_pair.target.config.vocab_size))
    pair = ModelPair(reference_pair.target, reference_pair.tokenizer, eagle=head.eval())
    prompts = ["def fib(n):\n    if n < 2:\n        return n\n", "for i in range(10):\n"]
    plain = [Engine(pair).generate(p, drafter=None, max_new_tokens=24).token_ids for p in prompts]
    one = [Engine(pair).generate(p, drafter="eagle", k=k, max_new_tokens=24).token_ids
           for p in prompts]
    batched = Engine(pair, max_batch=2).run([Job(p, 24) for p in prompts],
                                            StaticController("eagle", k))
    for prompt, want, got, row in zip(prompts, plain, one, batched):
        assert_lossless(pair, prompt, want, got)
        assert_lossless(pair, prompt, want, row.token_ids)


def test_saved_head_loads_without_the_borrowed_tensors_and_refuses_another_target(tmp_path):
    target = random_llama(40, seed=1)
    head = EagleHead(target, torch.tensor([0, 3, 7, 39]))
    save_eagle_head(head, tmp_path / "head")
    from safetensors.torch import load_file
    saved = load_file(str(tmp_path / "head" / "model.safetensors"))
    assert "lm_head.weight" not in saved and not any("embed" in k for k in saved)
    loaded = load_eagle_head(tmp_path / "head", target)
    ids, feats, pos = torch.tensor([[1, 2]]), torch.randn(1, 2, 16), torch.tensor([[1, 2]])
    assert torch.allclose(loaded(ids, feats, pos), head.eval()(ids, feats, pos), atol=1e-2)
    other = random_llama(50, seed=1)
    with pytest.raises(ValueError, match="40 x 16, target's 50 x 16"):
        load_eagle_head(tmp_path / "head", other)


def test_the_training_time_test_drafts_as_the_heads_cache_would():
    """chain_forward's pass j at pair t equals the head run causally over pairs 0..t (the
    true features) followed by its own fed-back predictions at positions t+2 .. t+j, the way
    drafting fills its cache: a mask letting a pass see another pair's predictions, or a
    position off by one, fails."""
    from autospec.training.eagle_train import chain_forward
    target = random_llama(40, seed=1)
    torch.manual_seed(0)
    head = EagleHead(target, torch.arange(40)).eval()
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    ids, feats = torch.randint(0, 40, (2, 9)), torch.randn(2, 9, 16)
    positions = torch.arange(1, 10).repeat(2, 1)
    slots = torch.tensor([[2, 5], [0, 4]])
    with torch.no_grad():
        passes = chain_forward(head, ids, feats, positions, slots, chain=3)
        assert torch.allclose(passes[0], head(ids, feats, positions), atol=1e-5)
        for b in range(2):
            for a, t in enumerate(slots[b].tolist()):
                seq_ids, seq_feats = ids[b, :t + 1], feats[b, :t + 1]
                for j in (1, 2):
                    fed = passes[j - 1][b, t if j == 1 else a]
                    seq_ids = torch.cat([seq_ids, ids[b, t + j:t + j + 1]])
                    seq_feats = torch.cat([seq_feats, fed[None]])
                    pos = torch.cat([positions[b, :t + 1],
                                     positions[b, t:t + 1] + torch.arange(1, j + 1)])
                    want = head(seq_ids[None], seq_feats[None], pos[None])[0, -1]
                    assert torch.allclose(passes[j][b, a], want, atol=1e-5), (b, t, j)


def test_eagle_without_a_head_is_a_clear_error(tiny_pair):
    assert "eagle" not in runnable_drafters(tiny_pair)
    with pytest.raises(ValueError, match="needs a feature head"):
        Engine(tiny_pair).generate("x = 1", drafter="eagle", k=2, max_new_tokens=4)
    with pytest.raises(ModelLoadError, match="not a head made for a target"):
        load_pair(str(tiny_pair.target_name), eagle=str(tiny_pair.target_name))


def test_a_controller_made_without_a_drafter_list_runs_only_what_the_pair_can(tiny_pair):
    """AdaptiveController() lists eagle by default; on a pair with no feature head the engine
    tells it so (attach) before its first decision."""
    from autospec.controller.adaptive import AdaptiveController
    controller = AdaptiveController()
    assert "eagle" in controller.drafters
    Engine(tiny_pair).generate("def f(x):", controller=controller, max_new_tokens=8)
    assert "eagle" not in controller.drafters and "ngram" in controller.drafters
