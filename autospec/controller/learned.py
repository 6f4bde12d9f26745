"""Deprecated (one release): the Learner moved to autospec.daemon.learner, the warm-start evaluation to autospec.bench.warm_start."""
from autospec.moved import forward

__getattr__ = forward({
    'Learner': 'autospec.daemon.learner',
    'SLOW_DISCOUNT': 'autospec.daemon.learner',
    'token_seconds': 'autospec.bench.warm_start',
    'steps_to_steady': 'autospec.bench.warm_start',
    'warm_vs_cold': 'autospec.bench.warm_start',
})
