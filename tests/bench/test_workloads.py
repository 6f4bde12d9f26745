"""The shipped workloads load, have the categories they claim, and keep tuning and judging apart."""
from collections import Counter

from autospec.bench.prompts import load_prompts
from conftest import REPO_ROOT

WORKLOADS = REPO_ROOT / "configs" / "workloads"


def test_heldout_workload_is_built_outside_the_standard_library():
    prompts = load_prompts(WORKLOADS / "heldout.jsonl")
    assert Counter(p.category for p in prompts) == {"copy-heavy": 8, "completion": 8, "prose": 8}
    assert len({p.id for p in prompts}) == 24
    # none of its prompts appears in the workloads that defaults and policies are tuned on
    tuned = {p.prompt for name in ("reference", "mixed") for p in load_prompts(WORKLOADS / f"{name}.jsonl")}
    assert not tuned & {p.prompt for p in prompts}


def test_no_policy_or_search_space_names_the_heldout_workload():
    root = WORKLOADS.parents[1]
    for path in list((root / "policies").glob("*.yaml")) + list((root / "configs").rglob("*.yaml")):
        assert "heldout" not in path.read_text(), path
