"""The drafters' confidences where the proposal is made, and a model drafter that stops a row
where its own probabilities say (autospec/confidence.py's StopRule)."""
import pytest
import torch

from autospec.confidence import BINS, Calibration, StopRule
from autospec.drafters.base import DraftContext, create_drafter
from autospec.drafters.draft_model import BatchDraftModel, DraftRow
from autospec.models.sampling import SamplingParams

PROMPT = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n"


def exact() -> Calibration:
    """A calibration that believes each confidence as its bin's centre (evidence beyond doubt)."""
    calibration = Calibration(strength=1e-9)
    for b in range(BINS):
        calibration.seen[b], calibration.kept[b] = 1e9, 1e9 * (b + 0.5) / BINS
    return calibration


def test_a_model_drafter_gives_its_probability_of_each_token(reference_pair):
    ids = reference_pair.tokenizer.encode(PROMPT)
    drafter = create_drafter("draft-model", reference_pair)
    draft = drafter.propose(DraftContext(ids, SamplingParams()), 8)
    assert len(draft.confidences) == len(draft.tokens) == 8
    # the first token's confidence is the draft model's softmax at its argmax
    with torch.inference_mode():
        logits = reference_pair.draft(torch.tensor([ids])).logits[0, -1].float()
    assert draft.confidences[0] == pytest.approx(float(logits.softmax(-1).max()), rel=1e-4)


@pytest.mark.parametrize("go", [0.9, 0.5, 0.2])
def test_a_model_drafter_stops_where_its_probabilities_say(reference_pair, go):
    """Drafting to a StopRule gives the first StopRule.cut tokens of the uncut draft: the
    row stops once the survival of its tokens falls below `go`, one forward per token it
    drafted, not per K."""
    ids = reference_pair.tokenizer.encode(PROMPT)
    rows = [DraftRow(0, DraftContext(ids, SamplingParams()), 12)]
    whole, _ = BatchDraftModel(reference_pair.draft, 1).propose(rows)
    rule = StopRule(exact(), [0.5] * 12, keep=go / 4, go=go)
    stopping = BatchDraftModel(reference_pair.draft, 1)
    cut, _ = stopping.propose([DraftRow(0, DraftContext(ids, SamplingParams(), stop=rule), 12)])
    n, drafted = rule.run(whole[0].confidences)
    assert cut[0].tokens == whole[0].tokens[:n]
    assert cut[0].confidences == pytest.approx(whole[0].confidences[:n])
    # one forward per token drafted (the dropped one's too, as replay charges): not one per K
    assert stopping.forwards == drafted
    if go == 0.9:
        assert n < 12


def test_ngram_and_suffix_give_a_confidence_per_token(reference_pair):
    ids = reference_pair.tokenizer.encode(PROMPT * 3)
    for name in ("ngram", "suffix"):
        draft = create_drafter(name, reference_pair).propose(DraftContext(ids, SamplingParams()), 8)
        assert draft.tokens and len(draft.confidences) == len(draft.tokens)
        assert all(0.0 < c <= 1.0 for c in draft.confidences)
