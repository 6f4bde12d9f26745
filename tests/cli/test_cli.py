"""The CLI, driven through click's CliRunner: bad input is one clear line, never a traceback."""
import json

import pytest
from clirun import error_line, invoke
from conftest import REPO_ROOT, assert_lossless_text


def run(*args):
    return invoke(args)


@pytest.fixture(scope="module")
def pair_args(tiny_dir):
    return ["--target", str(tiny_dir / "target"), "--draft", str(tiny_dir / "draft")]


def test_generate_streams_and_reports(pair_args):
    result = run("generate", "--prompt", "def f(x):", "--drafter", "draft-model", "--k", "3",
                 "--max-new-tokens", "12", *pair_args)
    assert result.exit_code == 0, result.output
    assert "mean accepted length" in result.output


def test_generate_runs_the_adaptive_controller_unless_a_drafter_is_named(pair_args, tiny_pair):
    """The product on by default: no --drafter, the controller picks (and says what it
    picked); --drafter none is plain."""
    auto = run("generate", "--prompt", "x = 1\nx = 1\nx = 1\n", "--max-new-tokens", "16", *pair_args)
    plain = run("generate", "--prompt", "x = 1\nx = 1\nx = 1\n", "--max-new-tokens", "16",
                "--drafter", "none", *pair_args)
    assert auto.exit_code == 0 and plain.exit_code == 0, auto.output + plain.output
    assert "[auto: " in auto.output and "[plain]" in plain.output
    # the same text (the telemetry line is on stderr), by the near-tie rule: trained weights
    assert_lossless_text(tiny_pair, "x = 1\nx = 1\nx = 1\n", plain.stdout, auto.stdout, 16)


def test_generate_json_telemetry(pair_args):
    result = run("generate", "--prompt", "x = 1", "--max-new-tokens", "5", "--json", *pair_args)
    assert result.exit_code == 0
    line = [ln for ln in result.output.splitlines() if ln.startswith("{")][-1]
    assert json.loads(line)["output_tokens"] == 5


@pytest.mark.parametrize("args, message", [
    (["--prompt", ""], "empty prompt"),
    (["--prompt", "x", "--drafter", "ngarm"], "unknown drafter 'ngarm' (known: auto, draft-model, eagle, early-exit, ngram, suffix, synthetic"),
    (["--prompt", "x", "--drafter", "ngram", "--k", "0"], "k must be >= 1, got 0"),
    (["--prompt", "x", "--drafter", "ngram", "--k", "-3"], "k must be >= 1, got -3"),
    (["--prompt", "x", "--temperature", "-1"], "temperature must be >= 0, got -1.0"),
    (["--prompt", "x " * 3000], "a row holds 2048 positions (max_len)"),
])
def test_generate_bad_input(pair_args, args, message):
    result = run("generate", *args, *pair_args)
    assert message in error_line(result)


def test_missing_model_path():
    result = run("generate", "--prompt", "x", "--target", "/nonexistent/model")
    assert "target model path '/nonexistent/model' does not exist" in error_line(result)


def test_draft_with_another_tokenizer_is_refused(tiny_dir, tmp_path):
    from autospec.models.presets import get_preset
    from autospec.models.tokenizer import train_tokenizer
    from autospec.models.train import make_model
    other = tmp_path / "other"
    tok = train_tokenizer(["def other():\n    return 'different corpus'\n" * 50], 300, other)
    make_model(get_preset("tiny").draft, len(tok), 512, tok.eos_token_id, 0).save_pretrained(other)
    result = run("generate", "--prompt", "x", "--target", str(tiny_dir / "target"),
                 "--draft", str(other))
    assert "has another tokenizer than target" in error_line(result)
    assert str(other) in error_line(result)


def test_bench_json_shape(pair_args, tmp_path):
    out = tmp_path / "bench.json"
    result = run("bench", "--limit", "1", "--max-new-tokens", "12", "--methods",
                 "plain,static:ngram:2,static:draft-model:2,hf:generate,hf:prompt-lookup:2,oracle,"
                 "oracle-per-category", "--json", str(out), *pair_args)
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert set(report) >= {"methods", "measured", "models", "machine"}
    for name, stats in report["methods"].items():
        for s in [stats["overall"], *stats["by_category"].values()]:
            assert set(s) >= {"tokens_per_s", "speedup_vs_plain", "identical_to_plain",
                              "acceptance_rate", "mean_accepted_length", "tokens", "wall_s"}
        assert stats["overall"]["identical_to_plain"] in (True, "near-tie"), name  # ties.py
    assert report["methods"]["oracle"]["picked"].startswith("static:")
    assert set(report["methods"]["oracle-per-category"]["picked"]) == {"completion", "copy-heavy", "prose"}
    assert report["methods"]["plain"]["overall"]["speedup_vs_plain"] == pytest.approx(1.0)
    # bandwidth from the telemetry's bytes: ours read weights, the hf: peers report none
    assert report["methods"]["plain"]["overall"]["bandwidth_gbs"] > 0
    assert report["methods"]["hf:generate"]["overall"]["bandwidth_gbs"] == 0
    assert "of this machine's measured copy peak" in result.output


@pytest.mark.parametrize("methods, message", [
    ("plain,static:ngarm:2", "unknown drafter 'ngarm'"),
    ("plain,static:ngram:0", "K must be >= 1 in method 'static:ngram:0', got 0"),
    ("plain,fast", "unknown method 'fast'"),
])
def test_bench_bad_methods(pair_args, methods, message):
    result = run("bench", "--methods", methods, *pair_args)
    assert message in error_line(result)


def test_bench_bad_prompts_file(pair_args, tmp_path):
    bad = tmp_path / "w.jsonl"
    bad.write_text('{"id": "a", "prompt": "x", "category": "c"}\n{"id": "b", "prompt": 3}\n')
    result = run("bench", "--prompts", str(bad), *pair_args)
    assert "w.jsonl:2: field 'prompt'" in error_line(result)


@pytest.mark.parametrize("option, message", [
    ("suffix.min_confidence=2", "suffix.min_confidence: expected a number in [0, 1], got 2"),
    ("suffix.bogus=1", "suffix.bogus: unknown field (accepted: budget_tokens, depth, "
                       "min_confidence, share, tenant)"),
    ("ngram.n_maxx=2", "drafter 'ngram' has no option 'n_maxx' (accepted: n_min, n_max)"),
    ("foo.n=2", "unknown drafter 'foo'"),
    ("ngram=2", "expected DRAFTER.NAME=VALUE"),
])
def test_bench_bad_drafter_option(pair_args, option, message):
    result = run("bench", "--drafter-option", option, *pair_args)
    assert message in error_line(result)


def test_bench_suffix_history_is_per_method_and_repeat(pair_args, tmp_path):
    """Each method and repeat starts with an empty cross-request history: otherwise the second
    method to run a prompt would find the first one's answer to it in the shared index."""
    from autospec.bench.methods import make_runner
    from autospec.drafters.suffix import shared_index
    from autospec.method import parse_method
    from autospec.cli.options import load_engine
    engine = load_engine(pair_args[1], pair_args[3], "float32")
    runners = [make_runner(parse_method("static:suffix:4"), engine) for _ in range(2)]
    for i, runner in enumerate(runners):
        runner.new_history(f"m{i} #0")
        runner(engine.encode("def f(x):\n    return x\n"), 8, 0.0, 0, None)
    assert len(shared_index(engine.models, "bench m0 #0")) > 0
    assert len(shared_index(engine.models, "bench m1 #0")) > 0
    assert len(shared_index(engine.models, None)) == 0  # the engine's own stayed untouched
    out = tmp_path / "b.json"
    policy = REPO_ROOT / "policies" / "suffix.yaml"
    result = run("bench", "--limit", "1", "--max-new-tokens", "12", "--repeats", "2",
                 "--methods", f"plain,static:suffix:4,adaptive:{policy}",
                 "--drafter-option", "suffix.min_confidence=0", "--json", str(out), *pair_args)
    assert result.exit_code == 0, result.output
    methods = json.loads(out.read_text())["methods"]
    assert all(m["overall"]["identical_to_plain"] for m in methods.values())


def test_each_pair_names_its_default_workloads():
    """A chat model is benchmarked on chat prompts, the reference pair on raw code and prose."""
    from autospec.models.pairs import PAIRS
    assert PAIRS["reference"].workload("bench").name == "reference.jsonl"
    assert PAIRS["reference"].workload("demo").name == "mixed.jsonl"
    assert PAIRS["smollm2"].workload("bench").name == "chat.jsonl"
    for spec in PAIRS.values():
        assert spec.workload("bench").is_file() and spec.workload("demo").is_file()
