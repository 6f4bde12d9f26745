"""`autospec models export --format vllm-eagle`: a feature head exported for vLLM drafts in
vLLM (its CPU build) what it drafts here, and an export is refused on another target.

One vLLM engine for the module: the shipped reference target with a feature head over the
whole vocabulary (vLLM scores the target's whole head, so the comparison is exact) whose every
tensor is random — a renaming that puts a tensor in the wrong place (the fc's halves, the two
norms, q and k: all the same shapes, loaded without a word) drafts other tokens. vLLM runs in
this process (VLLM_ENABLE_V1_MULTIPROCESSING=0) so the test wraps its EAGLE proposer's
`propose` and reads each draft with the context it was drafted from."""
import inspect
import json
import os
import shutil

import pytest
import torch

vllm = pytest.importorskip("vllm", reason="vLLM's CPU build (pip install -e '.[vllm]')")

from autospec.models.eagle_head import EagleHead, load_eagle_head, save_eagle_head  # noqa: E402
from autospec.paths import REFERENCE_DIR  # noqa: E402
from autospec.vllm.export import (EXPORT_KEY, ExportError, check_vllm_eagle,  # noqa: E402
                                  export_vllm_eagle, speculative_config)

from clirun import error_line, invoke  # noqa: E402
from conftest import NEAR_TIE, random_llama  # noqa: E402

TARGET = REFERENCE_DIR / "target"
K = 3
PROMPTS = ["def add(a, b):\n    return a + b\n", "import os\n\ndef main():\n",
           "for i in range(10):\n    print(i)\n"]


def random_head(target, seed: int) -> EagleHead:
    """A head over the whole vocabulary with every own tensor random (norm weights too)."""
    head = EagleHead(target, torch.arange(target.config.vocab_size))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if name == "lm_head.weight":
                continue  # the target's rows
            if name.endswith("norm.weight"):
                p.copy_(0.5 + torch.rand(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * p.shape[-1] ** -0.5)
    return head.eval()


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from transformers import AutoModelForCausalLM
    tmp = tmp_path_factory.mktemp("export")
    target = AutoModelForCausalLM.from_pretrained(TARGET, dtype=torch.float32).eval()
    save_eagle_head(random_head(target, seed=0), tmp / "head")  # bf16 on disk, as shipped
    ours = load_eagle_head(tmp / "head", target)  # the weights vLLM gets, in float32
    exported = export_vllm_eagle(tmp / "head", tmp / "vllm-eagle", target=TARGET)
    saved = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    try:
        # the KV cache's size given (vLLM's CPU worker otherwise sizes it from a share of RAM
        # less this process's RSS, which the suite's earlier tests have grown past that share)
        llm = vllm.LLM(str(TARGET), dtype="float32", enforce_eager=True,
                       kv_cache_memory_bytes=256 << 20, max_model_len=512, max_num_seqs=4,
                       seed=0, speculative_config=speculative_config(exported, TARGET, K))
        yield {"llm": llm, "target": target, "head": ours, "exported": exported, "tmp": tmp}
    finally:
        if saved is None:
            os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
        else:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = saved


def vllm_drafts(llm, prompt: str, max_tokens: int) -> list[tuple[list[int], list[int]]]:
    """(context, draft) of every proposal vLLM's EAGLE proposer made for one greedy request."""
    drafter = llm.llm_engine.model_executor.driver_worker.worker.model_runner.drafter
    assert type(drafter.model).__name__ == "EagleMistralForCausalLM"
    propose, calls = drafter.propose, []

    def watched(*args, **kwargs):
        bound = inspect.signature(propose).bind(*args, **kwargs).arguments
        rejected = bound.get("num_rejected_tokens_gpu")
        # the target's tokens with a KV entry, less the step's rejected drafts (read before
        # propose trims them), and the token it just sampled
        length = int(bound["common_attn_metadata"].seq_lens[0]) + 1 - (
            0 if rejected is None else int(rejected[0]))
        out = propose(*args, **kwargs)
        calls.append((length, int(bound["next_token_ids"][0]), out[0].tolist()))
        return out

    drafter.propose = watched
    try:
        params = vllm.SamplingParams(temperature=0.0, max_tokens=max_tokens)
        result = llm.generate([prompt], params, use_tqdm=False)[0]
    finally:
        del drafter.propose
    tokens = list(result.prompt_token_ids) + list(result.outputs[0].token_ids)
    for length, newest, _ in calls:
        assert tokens[length - 1] == newest  # the context is read right
    return [(tokens[:length], draft) for length, _, draft in calls]


@torch.no_grad()
def head_drafts(target, head, context: list[int], theirs: list[int]) -> list[tuple[int, float]]:
    """Our head's greedy token at each draft position, with its top-2 logit margin, from the
    target's features over `context` and, after position j, vLLM's own draft tokens 1..j (so
    each position is compared on the same inputs): pairs (f_t, x_{t+1}) at position t + 1,
    then the head's own predicted feature and token fed back, as models/eagle_head.py says."""
    features = target.model(torch.tensor([context[:-1]])).last_hidden_state  # after the norm
    ids, out = list(context[1:]), []
    for token in theirs:
        positions = torch.arange(1, len(ids) + 1)[None]
        predicted = head(torch.tensor([ids]), features, positions)[:, -1:]  # causal, no cache
        top = head.lm_head(predicted[0, 0]).topk(2)
        out.append((int(top.indices[0]), float(top.values[0] - top.values[1])))
        ids.append(token)
        features = torch.cat([features, predicted], 1)
    return out


def test_vllm_drafts_what_the_head_drafts(setup):
    compared, ties = 0, []
    for prompt in PROMPTS:
        proposals = vllm_drafts(setup["llm"], prompt, max_tokens=10)
        assert len(proposals) >= 5  # the prefill's proposal and the decode steps'
        for context, theirs in proposals:
            assert len(theirs) == K
            ours = head_drafts(setup["target"], setup["head"], context, theirs)
            for j, (token, margin) in enumerate(ours):
                compared += 1
                if token != theirs[j]:
                    assert margin < NEAR_TIE, (f"draft position {j + 1} after {len(context)} "
                                               f"tokens: vLLM {theirs[j]}, the head {token} "
                                               f"(margin {margin:.4f})")
                    ties.append((len(context), j, margin))
    assert compared >= 3 * 5 * K and len(ties) <= 1, ties


def test_export_holds_the_heads_tensors_renamed_and_records_its_target(setup):
    from safetensors.torch import load_file
    exported = setup["exported"]
    config = json.loads((exported / "config.json").read_text())
    assert config["architectures"] == ["EagleMistralForCausalLM"]
    assert config["num_hidden_layers"] == 1 and "autospec_eagle" not in config
    recorded = config[EXPORT_KEY]
    assert recorded["vocab_size"] == 4096 and recorded["head_vocab_subset"] == 4096
    assert len(recorded["target_embedding_sha256"]) == 64
    tensors = load_file(str(exported / "model.safetensors"))
    own = load_file(str(setup["tmp"] / "head" / "model.safetensors"))
    assert len(tensors) == len(own) - 1  # all but the subset's ids
    assert torch.equal(tensors["model.fc.weight"], own["fc.weight"])
    assert torch.equal(tensors["model.layers.0.input_layernorm.weight"],
                       own["layer.input_layernorm.weight"])
    assert check_vllm_eagle(exported, TARGET)["target_path"] == str(TARGET.resolve())


def test_a_subset_heads_export_drops_the_subset_and_says_so(setup, tmp_path):
    """vLLM's EAGLE-1 classes score the target's whole head: the subset's ids do not ship."""
    from safetensors.torch import load_file
    subset = torch.tensor([0, 5, 17, 4095])
    save_eagle_head(EagleHead(setup["target"], subset), tmp_path / "head")
    out = export_vllm_eagle(tmp_path / "head", tmp_path / "out", target=TARGET)
    recorded = json.loads((out / "config.json").read_text())[EXPORT_KEY]
    assert recorded["head_vocab_subset"] == 4 and recorded["draft_vocab"].startswith("full")
    assert not any("lm_head" in k for k in load_file(str(out / "model.safetensors")))


def another_target(tmp, name: str, change) -> str:
    """The reference target's files with `change(config, tensors)` applied."""
    from safetensors.torch import load_file, save_file
    out = tmp / name
    out.mkdir()
    config = json.loads((TARGET / "config.json").read_text())
    tensors = load_file(str(TARGET / "model.safetensors"))
    change(config, tensors)
    (out / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(out / "model.safetensors"))
    return str(out)


def test_a_head_exported_for_another_target_is_refused_naming_the_field(setup, tmp_path):
    exported = setup["exported"]

    def retrained(config, tensors):  # same shapes, other weights: vLLM would load it silently
        tensors["model.embed_tokens.weight"][7] += 0.01

    def rope(config, tensors):
        config["rope_parameters"]["rope_theta"] = 500000.0

    for name, change, field in [("retrained", retrained, "target_embedding_sha256"),
                                ("rope", rope, "target_config_sha256")]:
        other = another_target(tmp_path, name, change)
        with pytest.raises(ExportError) as caught:
            speculative_config(exported, other, K)
        message = str(caught.value)
        assert f"{EXPORT_KEY}.{field} is " in message and "\n" not in message, message
    random_llama(40, seed=1).save_pretrained(tmp_path / "small")
    with pytest.raises(ExportError, match=f"{EXPORT_KEY}.vocab_size is 4096, target '.*' has 40"):
        check_vllm_eagle(exported, tmp_path / "small")
    # the same target in another dtype is the same target
    same = another_target(tmp_path, "bf16", lambda c, t: t.update(
        {k: v.to(torch.bfloat16) for k, v in t.items()}))
    assert check_vllm_eagle(exported, same)["vocab_size"] == 4096
    # and the export itself refuses a head whose shapes are another target's
    with pytest.raises(ExportError, match="vocab_size 4096, target's 40"):
        export_vllm_eagle(setup["tmp"] / "head", tmp_path / "out", target=tmp_path / "small")


def test_cli_export_errors_are_one_line(tmp_path):
    line = error_line(invoke(["models", "export", "--pair", "smollm2", "--format", "gguf"]))
    assert "unknown format 'gguf'" in line and "vllm-eagle" in line
    line = error_line(invoke(["models", "export", "--pair", "reference", "--out", tmp_path]))
    assert "pair 'reference' has no feature head" in line


def test_cli_exports_a_head_directory_for_its_pair(tmp_path):
    """`--head` exports a head made by `models build` for the pair's target; without the
    fetched SmolLM2 target the command says what to run."""
    shutil.copytree(REFERENCE_DIR / "target", tmp_path / "cache" / "models" / "smollm2" / "target")
    from transformers import AutoModelForCausalLM
    target = AutoModelForCausalLM.from_pretrained(TARGET, dtype=torch.float32)
    save_eagle_head(random_head(target, seed=1), tmp_path / "head")
    env = {"AUTOSPEC_CACHE": str(tmp_path / "cache")}
    result = invoke(["models", "export", "--pair", "smollm2", "--head", tmp_path / "head"],
                    env=env)
    assert result.exit_code == 0, result.output
    out = tmp_path / "cache" / "models" / "smollm2-vllm-eagle"
    assert result.stdout.strip() == str(out)
    assert check_vllm_eagle(out, TARGET)["pair"] == "smollm2"
    empty = {"AUTOSPEC_CACHE": str(tmp_path / "empty")}
    line = error_line(invoke(["models", "export", "--pair", "smollm2"], env=empty))
    assert "autospec models fetch smollm2" in line
