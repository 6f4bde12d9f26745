"""The one-setting table (`autospec report --bench`): fixed settings and adaptive are told
apart by their report keys, a format's suffix included."""
import json

from autospec.bench.one_setting import is_fixed, one_setting_table


def report(speeds: dict[str, float], workload: str) -> dict:
    return {"settings": {"pair": "reference", "workload": workload},
            "methods": {spec: {"overall": {"tokens_per_s": v}} for spec, v in speeds.items()}}


def test_fixed_settings_are_known_by_kind_at_any_format(tmp_path):
    assert all(map(is_fixed, ("plain", "plain@int4", "static:ngram:4@int4", "ctl:ema",
                              "vllm:ngram:2")))
    assert not any(map(is_fixed, ("adaptive", "adaptive@int4", "hf:generate", "ours:plain",
                                  "oracle")))
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(report({"plain@int4": 10, "static:ngram:2@int4": 20,
                                    "adaptive@int4": 18}, "chat")))
    b.write_text(json.dumps(report({"plain@int4": 10, "static:ngram:2@int4": 8,
                                    "adaptive@int4": 12}, "prose")))
    table = one_setting_table([a, b])
    # each fixed setting's worst cell: plain 0.50 (chat), n-gram 0.80 (prose); adaptive's 0.90
    assert "| plain@int4 | 0.50 | 1.00 | 0.50 |" in table
    assert "best single fixed setting: static:ngram:2@int4, worst cell 0.80" in table
    assert "adaptive@int4: worst cell 0.90" in table
