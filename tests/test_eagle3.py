"""The EAGLE-3 draft head: its public on-disk layout, the training-time test against step-by-step drafting,
drafting chains and trees, recording and replay (training: tests/test_draft_training.py)."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import numpy as np
import pytest
import torch
from conftest import flat_profile, tiny_llama
from safetensors.torch import load_file, save_file

from adaptive.cached_model import CachedModel
from adaptive.copy_draft import CopyDraft, PromptLookupDraft
from adaptive.decoder import SpeculativeDecoder, generate_plain
from adaptive.drafts import draft_session, target_taps
from adaptive.eagle3 import Eagle3Config, Eagle3Head, load_head, rotary, save_head
from adaptive.recorder import draft_trace, record
from adaptive.traces import TraceSet
from adaptive.tree import DraftTree, TreeShape, grow_level
from adaptive.tree_decoder import TreeDecoder
from adaptive.tree_traces import record_trees
from envs.replay import ReplayBackend
from envs.rollout import run_policy
from envs.tree_replay import TreeReplayBackend
from lab.distill_eagle3 import unrolled_loss
from lab.draft_training import draft_log_probs, target_states
from policies import make_policy

VOCAB_IDS = torch.tensor([0, 1, 2, 3, 5, 8, 9, 12, 13, 15])


@pytest.fixture(scope="module")
def deep_target():
    return tiny_llama(seed=3, layers=6, dtype=torch.float32)


def _head(target, seed: int = 0) -> Eagle3Head:
    torch.manual_seed(seed)
    head = Eagle3Head(Eagle3Config.for_target(target.config, len(VOCAB_IDS)), target.get_input_embeddings()).float()
    head.set_vocabulary(VOCAB_IDS)
    return head


def test_layout_round_trip_and_public_names(deep_target, tmp_path):
    head = _head(deep_target)
    save_head(head, tmp_path / "head", {"note": "test"})
    config = json.loads((tmp_path / "head" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["draft_vocab_size"] == len(VOCAB_IDS)
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 3, 3]  # 2, L/2, L-3 for L = 6
    names = set(load_file(tmp_path / "head" / "model.safetensors"))
    assert {"fc.weight", "midlayer.self_attn.q_proj.weight", "midlayer.hidden_norm.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"} <= names
    assert not any("embed_tokens" in name for name in names)  # the target's embedding is borrowed, not stored
    loaded = load_head(tmp_path / "head", deep_target)
    for name, tensor in head.state_dict().items():
        assert torch.equal(tensor, loaded.state_dict()[name]), name
    assert torch.equal(loaded.target_ids, VOCAB_IDS)
    assert loaded.t2d.sum() == len(VOCAB_IDS) and bool(loaded.t2d[VOCAB_IDS].all())


def test_a_published_checkpoint_without_t2d_and_with_a_model_prefix_loads(deep_target, tmp_path):
    head = _head(deep_target)
    save_head(head, tmp_path / "head")
    tensors = {("model." + k if k.startswith("midlayer") else k): v for k, v in load_file(tmp_path / "head" / "model.safetensors").items() if k != "t2d"}
    tensors["embed_tokens.weight"] = deep_target.get_input_embeddings().weight.detach().clone()
    save_file(tensors, tmp_path / "head" / "model.safetensors")
    loaded = load_head(tmp_path / "head", deep_target)
    assert torch.equal(loaded.t2d, head.t2d) and torch.equal(loaded.fc.weight, head.fc.weight)


def test_a_head_for_another_target_is_refused(deep_target, tmp_path):
    save_head(_head(deep_target), tmp_path / "head")
    with pytest.raises(ValueError, match="vocabulary 16 and width 32"):
        load_head(tmp_path / "head", tiny_llama(seed=1, vocab=24, dtype=torch.float32))


def _drafted_states(head: Eagle3Head, tokens: torch.Tensor, aux: torch.Tensor, base: int, steps: int) -> list[torch.Tensor]:
    """Reference: what drafting from position ``base`` computes one entry at a time with a growing cache
    (step 0 entries 0..base from the target's states, then the head's own states)."""
    layer, config = head.midlayer, head.config
    keys, values = [], []
    fused = head.fc(aux)
    for t in range(base + 1):  # context entries, each attending to those before it
        cos, sin = rotary(torch.tensor([t]), config.head_dim, config.rope_theta, fused.dtype)
        q, k, v = layer.self_attn.project(layer.inputs(head.embedding(tokens[t + 1 : t + 2]), fused[t : t + 1]), cos, sin)
        keys.append(k)
        values.append(v)
        out = layer.finish(fused[t : t + 1], layer.self_attn.attend(q, torch.cat(keys, -2), torch.cat(values, -2), None))
    states = [out]
    for step in range(1, steps):
        position = base + step
        cos, sin = rotary(torch.tensor([position]), config.head_dim, config.rope_theta, fused.dtype)
        q, k, v = layer.self_attn.project(layer.inputs(head.embedding(tokens[position + 1 : position + 2]), states[-1]), cos, sin)
        keys.append(k)
        values.append(v)
        states.append(layer.finish(states[-1], layer.self_attn.attend(q, torch.cat(keys, -2), torch.cat(values, -2), None)))
    return states


def test_training_time_test_equals_step_by_step_drafting(deep_target):
    head = _head(deep_target, seed=1).double()
    torch.manual_seed(5)
    tokens = torch.randint(0, 16, (1, 14))
    aux = torch.randn(1, 14, 3 * head.config.hidden_size, dtype=torch.float64)
    unrolled = head.unrolled(tokens, aux, steps=4)
    for base in (0, 3, 7):
        reference = _drafted_states(head, tokens[0], aux[0], base, steps=4)
        for step in range(4):
            assert torch.allclose(unrolled[step][0, base], reference[step][0], atol=1e-10), (base, step)


@pytest.mark.parametrize("spec", ["static:1", "static:4", "heuristic:2", "confidence:0.3"])
def test_greedy_decoding_with_a_head_is_identical_to_plain_greedy(eagle_head, target, spec):
    decoder = SpeculativeDecoder(target, eagle_head, make_policy(spec))
    for prompt in ([1, 5, 2, 9, 4, 4, 7], [3], [6, 6]):
        result = decoder.generate(prompt, max_new_tokens=30)
        assert result.token_ids == generate_plain(target, prompt, 30).token_ids
        assert any(r.drafted for r in result.rounds)


def test_a_head_drafts_from_the_targets_states_and_rolls_its_own_back(eagle_head, target):
    """After every round the head holds only entries made from the target's states, one per verified
    position, and the target keeps exactly those positions' hidden states."""
    decoder = SpeculativeDecoder(target, eagle_head, make_policy("static:3"))
    generation = decoder.start([1, 5, 2, 9, 4], 20)
    assert generation.max_depth > 0 and decoder.draft.length == 4
    while not generation.done:
        while generation.depth < min(3, generation.max_depth):
            generation.draft_step()
        generation.verify(generation.depth)
        head, cached = decoder.draft, decoder.target
        assert cached.tapped.shape == (cached.length, 3 * target.config.hidden_size)
        assert head.first_own is None and len(head.states) == head.length - 1 <= cached.length
    assert decoder.start([4], 8).max_depth == 0  # one prompt token: no target state yet, nothing to draft from


def test_a_trained_heads_first_step_agrees_with_its_training_time_test(eagle_head, target):
    """The session's first draft logits at the end of a context are the unrolled step-0 logits there."""
    tokens = [1, 5, 2, 9, 4, 4, 7]
    decoder = SpeculativeDecoder(target, eagle_head, make_policy("static:1"))
    generation = decoder.start(tokens, 4)
    generation.draft_step()
    with torch.no_grad():
        hidden = target.model(input_ids=torch.tensor([tokens]), output_hidden_states=True).hidden_states
        aux = torch.cat([hidden[i] for i in eagle_head.config.layer_ids], dim=-1)
        states = eagle_head.unrolled(torch.tensor([tokens]), aux, steps=1)[0]
    expected = eagle_head.target_logits(states[0, len(tokens) - 2]).argmax()
    assert generation.steps()[0].token == int(expected)


def _sessions(head, target, context: list[int]):
    """A target session that has processed all of ``context`` but its last token, and the head's session on it."""
    cached = CachedModel(target, taps=target_taps(head))
    cached.forward(context[:-1])
    session = draft_session(head, cached)
    return cached, session


def test_a_heads_tree_levels_equal_chain_drafting_along_each_path(eagle_head, target):
    """Every node of a tree the head grows (one batched masked forward per level) has the log-probability the
    head gives its token when drafting that node's path as a chain, token by token."""
    context = [1, 5, 2, 9, 4, 4, 7]
    _, session = _sessions(eagle_head, target, context)
    tree = DraftTree()
    tree.add_children(-1, session.forward(context)[-1], 3)
    for _ in range(3):
        grow_level(session, [tree], [len(context)], TreeShape(3, 2, 64), time.perf_counter)
    assert tree.depth == 4
    for index, node in enumerate(tree.nodes):
        _, chain = _sessions(eagle_head, target, context)
        logits = chain.forward(context)[-1]
        for ancestor in tree.ancestors(index):
            logits = chain.forward([tree.nodes[ancestor].token])[-1]
        assert node.log_prob == pytest.approx(float(torch.log_softmax(logits.double(), -1)[node.token]), abs=1e-9), index


@pytest.mark.parametrize("shape", [TreeShape(2, 2, 8), TreeShape(4, 3, 24), TreeShape(1, 1, 16)])
def test_greedy_tree_decoding_with_a_head_is_identical_to_plain_greedy(eagle_head, target, shape):
    for prompt in ([1, 5, 2, 9, 4, 4, 7], [6, 6]):
        result = TreeDecoder(target, eagle_head, make_policy("static:4"), shape, max_depth=5).generate(prompt, 30)
        assert result.token_ids == generate_plain(target, prompt, 30).token_ids
        assert any(r.accepted for r in result.rounds)


def test_a_k1_tree_with_a_head_is_the_chain_decoder(eagle_head, target):
    chain = SpeculativeDecoder(target, eagle_head, make_policy("static:3")).generate([1, 5, 2, 9, 4], 30)
    tree = TreeDecoder(target, eagle_head, make_policy("static:3"), TreeShape(1, 1, 64)).generate([1, 5, 2, 9, 4], 30)
    assert [(r.drafted, r.accepted, r.emitted) for r in tree.rounds] == [(r.drafted, r.accepted, r.emitted) for r in chain.rounds]


@pytest.mark.parametrize("spec", ["static:1", "static:3", "static:6", "heuristic:2"])
def test_replay_of_a_heads_traces_accepts_what_live_decoding_accepts(eagle_head, target, spec):
    """Greedy chain traces of a head (every position drafted from its own rollout) replay live rounds exactly."""
    prompts = [[1, 4, 6], [9, 2, 2, 5, 11], [7, 7, 1, 0]]
    decoder = SpeculativeDecoder(target, eagle_head, make_policy("static:1"))
    traces = record(decoder, [{"id": str(i), "lang": "en"} for i in range(len(prompts))], prompts, max_new_tokens=30, depth=6, metadata={})
    replayed = run_policy(ReplayBackend(traces, flat_profile()), make_policy(spec), range(len(prompts)))
    for prompt, episode in zip(prompts, replayed, strict=True):
        live = SpeculativeDecoder(target, eagle_head, make_policy(spec), max_depth=6).generate(prompt, 30)
        assert [(c.drafted, c.accepted, c.emitted) for c in episode.cycles] == [(r.drafted, r.accepted, r.emitted) for r in live.rounds]
    assert sum(c.accepted for e in replayed for c in e.cycles) > 0


COPY_PROMPTS = [[15, 0, 9, 4, 2, 11, 15, 0, 9], [1, 2, 3, 1, 2], [7, 7, 7, 7], [3, 8, 5, 3, 8, 5, 3], [1, 4, 6], [9, 2, 2, 5, 11]]


@pytest.fixture(scope="module")
def trained_head(target):
    """A head trained briefly (60 steps, training-time test over 3 steps) on the tiny target's greedy outputs:
    it drafts well, so what it drafts after copied tokens read from its own states matters."""
    torch.manual_seed(11)
    head = Eagle3Head(Eagle3Config.for_target(target.config, 16, layer_ids=(0, 1, 2)), target.get_input_embeddings()).to(target.dtype)
    head.set_vocabulary(torch.arange(16))
    generator = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 16, (6,), generator=generator).tolist() for _ in range(32)]
    tokens = torch.tensor([p + generate_plain(target, p, 40).token_ids for p in prompts])
    mask = torch.zeros_like(tokens, dtype=torch.bool)
    mask[:, 5:-1] = True
    aux, final = target_states(target, tokens, torch.ones_like(tokens), (0, 1, 2))
    teacher = draft_log_probs(final, target.get_output_embeddings().weight)
    optimiser = torch.optim.Adam([p for p in head.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(60):
        loss, _ = unrolled_loss(head, tokens, aux, teacher, mask, 3, 0.8)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    return head.eval()


@pytest.fixture(scope="module")
def head_copy_traces(trained_head, target):
    decoder = SpeculativeDecoder(target, trained_head, make_policy("static:1"))
    rows = [{"id": str(i), "lang": "en"} for i in range(len(COPY_PROMPTS))]
    return record(decoder, rows, COPY_PROMPTS, 40, depth=8, metadata={}, copy=CopyDraft(min_match=1))


@pytest.mark.parametrize("drafter", ["copy", "prompt lookup"])
@pytest.mark.parametrize("spec", ["static:4:copy+model", "static:6:copy+model", "static:8:copy+model", "static:3:copy", "suffix"])
def test_replay_of_a_heads_copy_rounds_reproduces_live_rounds(head_copy_traces, trained_head, target, drafter, spec):
    """A head reads a copy+model round's copied tokens from its own states: replay takes the chain recorded
    after them, and every round's drafted, verified, accepted and emitted tokens equal live decoding's, with
    the copy drafter or prompt lookup beside the head. (Replaying the head's chain at t + a instead, as for
    drafts that read only tokens, misses live rounds here: see the next test.)"""
    traces, copy = (
        (head_copy_traces, CopyDraft(min_match=1)) if drafter == "copy" else (head_copy_traces.with_lookup_as_copy(), PromptLookupDraft(num_tokens=8))
    )
    episodes = run_policy(ReplayBackend(traces, flat_profile(), max_depth=8), make_policy(spec), list(range(len(COPY_PROMPTS))), decision_seconds=0.0)
    decoder = SpeculativeDecoder(target, trained_head, make_policy(spec), max_depth=8, copy=copy)
    for prompt, episode in zip(COPY_PROMPTS, episodes, strict=True):
        live = decoder.generate(prompt, 40).rounds
        assert [(c.drafted, c.verified, c.accepted, c.emitted) for c in episode.cycles] == [(r.drafted, r.verified, r.accepted, r.emitted) for r in live]


def test_a_heads_chain_after_copied_tokens_is_not_its_chain_at_that_position(head_copy_traces, trained_head, target, tmp_path):
    """Where the copied tokens all match, the head's chain after reading them itself is mostly not the one it
    drafts from the target's states at t + a, and replaying the latter misses live rounds; a file keeps it."""
    lookup = head_copy_traces.with_lookup_as_copy()
    chains = lookup.copy
    reached = np.nonzero(chains.after_match >= 0)[0]
    there = reached + chains.available[reached]  # the same prompt: only rounds that reach the model are recorded
    assert len(reached) >= 20 and (chains.after_match[reached] > 0).mean() > 0.5
    assert (chains.after_match[reached] != head_copy_traces.match[there]).mean() > 0.5
    former = replace(lookup, copy=replace(chains, after_match=None, after_features=None))
    episodes = run_policy(ReplayBackend(former, flat_profile(), max_depth=8), make_policy("static:8:copy+model"), list(range(len(COPY_PROMPTS))), 0.0)
    decoder = SpeculativeDecoder(target, trained_head, make_policy("static:8:copy+model"), max_depth=8, copy=PromptLookupDraft(num_tokens=8))
    missed = [[c.accepted for c in e.cycles] != [r.accepted for r in decoder.generate(p, 40).rounds] for p, e in zip(COPY_PROMPTS, episodes)]
    assert any(missed)
    head_copy_traces.save(tmp_path / "traces.npz")
    reloaded = TraceSet.load(tmp_path / "traces.npz")
    np.testing.assert_array_equal(reloaded.copy.after_match, head_copy_traces.copy.after_match)
    np.testing.assert_allclose(reloaded.lookup.after_features, head_copy_traces.lookup.after_features, atol=1e-3)


def test_a_heads_tree_traces_replay_live_tree_rounds(eagle_head, target):
    prompts, shape = [[1, 4, 6], [9, 2, 2, 5, 11]], TreeShape(3, 2, 6)
    outputs = [generate_plain(target, p, 30).token_ids for p in prompts]
    traces = record_trees(target, eagle_head, [{"id": str(i), "lang": "en"} for i in range(2)], prompts, outputs, shape, 4, {"max_new_tokens": 30})
    for gamma in (1, 4):
        replayed = run_policy(TreeReplayBackend(traces, flat_profile(), max_depth=4, size=6), make_policy(f"static:{gamma}"), range(2), 0.0)
        for prompt, episode in zip(prompts, replayed, strict=True):
            live = TreeDecoder(target, eagle_head, make_policy(f"static:{gamma}"), shape, max_depth=4).generate(prompt, 30)
            assert [(c.drafted, c.verified, c.accepted) for c in episode.cycles] == [(r.drafted, r.verified, r.accepted) for r in live.rounds]


def test_recording_refuses_a_one_token_prompt_for_a_head(eagle_head, target):
    with pytest.raises(ValueError, match="2 tokens or more"):
        draft_trace(target, eagle_head, [3], [4, 5, 6], 3)
