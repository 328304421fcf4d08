"""Integration with the real default pair (SmolLM2-135M-Instruct + the shipped EAGLE-3 head), bounded in time.

Greedy token identity is a guarantee at float32, so the pair is loaded at float32 here (its default dtype,
auto, is bfloat16 on CPUs that multiply it natively).

The first run on a fresh machine converts the GGUF target once (about 20 s)."""

from __future__ import annotations

import pytest
import torch

from adaptive import SamplingConfig, SpeculativeDecoder, generate_plain, load_pair
from adaptive.eagle3 import Eagle3Head, is_head_folder
from adaptive.integrations.transformers import generate as adaptive_generate
from adaptive.pair import ASSETS, PAIRS, load_target
from adaptive.traces import TraceSet
from adaptive.workload import COPY_TASKS, LANGUAGES, chat_ids, load_prompts
from lab.draft_training import workload_sequences
from lab.recording import TRACES
from policies import make_policy

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pair():
    return load_pair("smollm2-135m", "float32")


def test_pair_loads_by_name_offline_with_a_small_shipped_head(pair):
    """The default draft is the EAGLE-3 head in the public layout (config.json + model.safetensors with d2t)."""
    assert pair.target.config.vocab_size == 49152
    folder = ASSETS / PAIRS["smollm2-135m"].draft
    assert is_head_folder(folder) and (folder / "model.safetensors").stat().st_size < 50e6
    assert isinstance(pair.draft, Eagle3Head) and pair.draft.config.layer_ids == (2, 15, 27)
    assert sum(p.numel() for p in pair.draft.parameters()) < 0.2 * sum(p.numel() for p in pair.target.model.layers.parameters())


def test_an_unknown_pair_name_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match="unknown pair 'smollm2-1b'; known pairs: smollm2-135m "):
        load_target("smollm2-1b")


def test_the_standalone_pair_loads_by_name_and_speculates_exactly(pair):
    """``smollm2-135m-standalone``: the same target with the 2-layer draft distilled on the draft-training
    pool (fp32): greedy speculation equals plain greedy and gets draft tokens accepted."""
    assert "smollm2-135m-standalone" in PAIRS
    standalone = load_pair("smollm2-135m-standalone", "float32")
    assert (ASSETS / PAIRS["smollm2-135m-standalone"].draft / "draft.safetensors").stat().st_size < 50e6
    ids = chat_ids(standalone.tokenizer, load_prompts("test", lang="es")[0]["prompt"])
    result = SpeculativeDecoder(standalone.target, standalone.draft, make_policy("static:4"), tokenizer=standalone.tokenizer).generate(ids, 24)
    assert result.token_ids == generate_plain(pair.target, ids, 24).token_ids
    assert sum(r.accepted for r in result.rounds) >= 6


@pytest.fixture(scope="module")
def greedy_runs(pair):
    """Per language: (speculative, plain) greedy results on one test prompt, 32 new tokens."""
    decoder = SpeculativeDecoder(pair.target, pair.draft, make_policy("static:4"), tokenizer=pair.tokenizer)
    runs = {}
    for lang in LANGUAGES:
        ids = chat_ids(pair.tokenizer, load_prompts("test", lang=lang)[1]["prompt"])
        runs[lang] = (decoder.generate(ids, 32), generate_plain(pair.target, ids, 32))
    return runs


@pytest.mark.parametrize("lang", LANGUAGES)
def test_greedy_speculation_is_token_identical_to_plain_greedy(greedy_runs, lang):
    speculative, plain = greedy_runs[lang]
    assert speculative.token_ids == plain.token_ids


@pytest.mark.parametrize("lang", LANGUAGES)
def test_greedy_tree_decoding_is_token_identical_to_plain_greedy(pair, greedy_runs, lang):
    from adaptive.tree import TreeShape
    from adaptive.tree_decoder import TreeDecoder

    plain = greedy_runs[lang][1]
    decoder = TreeDecoder(pair.target, pair.draft, make_policy("static:3"), TreeShape(4, 4, 12), tokenizer=pair.tokenizer)
    result = decoder.generate(plain.prompt_ids, 32)
    assert result.token_ids == plain.token_ids
    assert result.mean_emitted > 1.0  # the tree gets draft tokens accepted


def test_the_shipped_head_gets_tokens_accepted(greedy_runs):
    """Pooled per-token acceptance α = accepted / (accepted + rejections) over the four prompts.

    The shipped head (step 8,000, fp32) gets 0.65 on these four prompts (it 0.89, en 0.39, zh 0.85, es 0.45); the
    former 2-layer draft got 0.35 over all 185 test prompts (benchmarks/greedy_identity.py), an untrained draft ≈ 0.05.
    """
    rounds = [r for speculative, _ in greedy_runs.values() for r in speculative.rounds if r.verified]
    accepted = sum(r.accepted for r in rounds)
    rejections = sum(1 for r in rounds if r.accepted < r.verified)
    assert accepted / (accepted + rejections) > 0.4


def test_sampled_speculation_runs_with_the_reduced_vocabulary_draft(pair):
    ids = chat_ids(pair.tokenizer, load_prompts("test", lang="zh")[0]["prompt"])
    decoder = SpeculativeDecoder(pair.target, pair.draft, make_policy("heuristic"), SamplingConfig(0.7), tokenizer=pair.tokenizer)
    result = decoder.generate(ids, 24, seed=1)
    assert 1 <= len(result.token_ids) <= 24 and all(1 <= r.emitted <= r.verified + 1 for r in result.rounds)


def test_every_request_of_a_mixed_batch_is_greedy_identical_on_the_real_pair(pair, greedy_runs):
    """Two test prompts per language, four at a time (requests join as others finish), static:3, fp32: each
    output equals plain greedy decoding of that prompt alone."""
    from adaptive.batch_decoder import BatchedSpeculativeDecoder
    from policies.batch import FixedBatchDepth

    prompts = [chat_ids(pair.tokenizer, load_prompts("test", lang=lang)[i]["prompt"]) for i in (1, 2) for lang in LANGUAGES]
    decoder = BatchedSpeculativeDecoder(pair.target, pair.draft, FixedBatchDepth(3), tokenizer=pair.tokenizer, max_batch=4)
    results = decoder.generate(prompts, max_new_tokens=32)
    plain = [greedy_runs[lang][1].token_ids for lang in LANGUAGES] + [generate_plain(pair.target, ids, 32).token_ids for ids in prompts[4:]]
    assert [r.token_ids for r in results] == plain
    assert sum(sum(r.accepted) for r in results) > 32


@pytest.mark.parametrize("lang", LANGUAGES)
def test_the_generate_route_on_the_real_pair_is_plain_generate_at_fp32(pair, greedy_runs, lang):
    """transformers' own generate() with our loop (custom_generate) and the heuristic policy: the same tokens
    as transformers' plain greedy generate() (fp32)."""
    ids = torch.tensor([greedy_runs[lang][1].prompt_ids])
    plain = pair.target.generate(ids, max_new_tokens=32, do_sample=False, pad_token_id=pair.tokenizer.eos_token_id)
    routed = pair.target.generate(
        ids,
        custom_generate=adaptive_generate,
        draft=pair.draft,
        policy=make_policy("heuristic"),
        max_new_tokens=32,
        do_sample=False,
        pad_token_id=pair.tokenizer.eos_token_id,
    )
    assert torch.equal(routed, plain)


def test_a_draft_is_measured_on_the_workload_split_as_its_traces_hold_it(pair):
    """What ``adaptive distill`` measures beside its held-out pool: val prompts in chat form and the target's
    greedy outputs from the val traces, the first of each language."""
    traces = TraceSet.load(TRACES / "smollm2-135m-val.npz")
    prompts = {p["id"]: p["prompt"] for p in load_prompts("val")}
    sequences = workload_sequences(traces, prompts, pair.tokenizer, 2)
    assert sorted(s.lang for s in sequences) == sorted(LANGUAGES * 2)
    first = sequences[0]
    index = traces.prompt_ids.index(first.id.split(":", 1)[1])
    assert first.prompt == chat_ids(pair.tokenizer, prompts[traces.prompt_ids[index]])
    assert first.response == traces.outputs[traces.offsets[index] : traces.offsets[index + 1]].tolist()
    assert first.response[:8] == generate_plain(pair.target, first.prompt, 8).token_ids  # the target's own greedy answer
    copy_heavy = {p["id"]: p["prompt"] for p in load_prompts("val") if p["task"] in COPY_TASKS}
    sequences = workload_sequences(TraceSet.load(TRACES / "smollm2-135m-val-copy.npz"), copy_heavy, pair.tokenizer, 3)  # the copy traces hold them
    assert sorted(s.lang for s in sequences) == sorted(LANGUAGES * 3) and all(s.id.split(":", 1)[1] in copy_heavy for s in sequences)
