"""Self-speculative drafting: the target's own first L layers, decoded through its head.

Works because the reference target is trained with a LayerSkip-style exit loss; on other
targets it runs but proposes worse tokens. The view shares the target's weights, and keeps
its own (L-layer) cache.
"""
from __future__ import annotations

from autospec.drafters.contract import register
from autospec.drafters.draft_model import BatchDraftModel, CachedLMDrafter


@register("early-exit")
class EarlyExitDrafter(CachedLMDrafter):
    cost_hint = 0.3

    def __init__(self, models, exit_layer: int | None = None):
        self.exit_layer = exit_layer or models.default_exit_layer
        super().__init__(models.early_exit_view(self.exit_layer))
        self.cost_hint = self.exit_layer / models.target.config.num_hidden_layers

    @classmethod
    def batch_drafting(cls, models, max_batch: int, max_len: int, exit_layer: int | None = None):
        return BatchDraftModel(models.early_exit_view(exit_layer or models.default_exit_layer),
                               max_batch, max_len)
