"""Draft trees: the tree attention mask against brute-force forwards per path, greedy output identical to
plain greedy, a k=1 tree identical to the chain decoder, and cache compaction to the accepted path."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from conftest import tiny_llama

from adaptive.cached_model import CachedModel
from adaptive.decoder import SpeculativeDecoder, generate_plain
from adaptive.tree import DraftTree, TreeShape, accept_greedy, attention_mask, grow_level
from adaptive.tree_decoder import TreeDecoder
from policies import StaticDepth, make_policy

PROMPT = [1, 5, 2, 9, 4, 4, 7]


def _grown_tree(draft, context: list[int], shape: TreeShape, depth: int) -> DraftTree:
    """A tree grown by the decoder's own expansion step (``grow_level``) below ``context``."""
    model = CachedModel(draft)
    tree = DraftTree()
    tree.add_children(-1, model.forward(context)[-1], shape.branching)
    for _ in range(depth - 1):
        grow_level(model, [tree], [len(context)], shape, time.perf_counter)
    return tree


def _last_logits(model, tokens: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=torch.tensor([tokens])).logits[0, -1]


def test_tree_forward_matches_a_plain_forward_of_every_path(target):
    """Every node's logits under the tree mask equal the logits of feeding context + its path plainly."""
    context = PROMPT
    tree = _grown_tree(target, context, TreeShape(3, 2, 64), depth=3)
    selected = tree.select(len(tree.nodes))
    model = CachedModel(target)
    model.forward(context[:-1])
    cached = model.length
    prefixes = [cached] + [len(context)] * len(selected)
    ancestors = [[]] + [[len(context) + selected.index(a) for a in tree.ancestors(i)] for i in selected]
    positions = [cached] + [len(context) - 1 + tree.nodes[i].depth for i in selected]
    mask = attention_mask(cached, prefixes, ancestors, torch.float64, target.device)
    logits = model.forward_masked([context[-1]] + [tree.nodes[i].token for i in selected], positions, mask)
    assert torch.allclose(logits[0], _last_logits(target, context), atol=1e-10)
    for row, index in enumerate(selected, start=1):
        path = [tree.nodes[a].token for a in tree.ancestors(index)] + [tree.nodes[index].token]
        assert torch.allclose(logits[row], _last_logits(target, context + path), atol=1e-10), f"node {index}"


def test_draft_growth_matches_plain_forwards(target):
    """Children added at depth 3 come from the draft's logits at their parent's path, as if fed plainly."""
    tree = _grown_tree(target, PROMPT, TreeShape(2, 2, 64), depth=3)
    for index, node in enumerate(tree.nodes):
        if node.depth == 3:
            parent_path = [tree.nodes[a].token for a in tree.ancestors(index)]
            expected = torch.log_softmax(_last_logits(target, PROMPT + parent_path), -1)[node.token]
            assert node.log_prob == pytest.approx(float(expected), abs=1e-9)


def test_selection_is_ancestor_closed_and_acceptance_follows_the_target_choices():
    tree = DraftTree()
    tree.add_children(-1, torch.tensor([0.0, 3.0, 2.0, -5.0]), 2)  # nodes 0 (token 1), 1 (token 2)
    tree.add_children(0, torch.tensor([1.0, 0.0, 0.0, 4.0]), 2)  # nodes 2 (token 3), 3 (token 0)
    selected = tree.select(3)
    assert all(tree.nodes[i].parent in (-1, *selected) for i in selected)
    assert accept_greedy(tree, tree.select(4), 1, [3, 7, 9, 9]) == [0, 2]
    assert accept_greedy(tree, tree.select(4), 2, [3, 7, 9, 9]) == [1]
    assert accept_greedy(tree, tree.select(4), 0, [3, 7, 9, 9]) == []


@pytest.mark.parametrize("shape", [TreeShape(2, 2, 8), TreeShape(4, 3, 24), TreeShape(3, 4, 5), TreeShape(1, 1, 16)])
@pytest.mark.parametrize("policy", ["static:3", "static:6", "entropy:1.0"])
def test_greedy_tree_decoding_is_identical_to_plain_greedy(target, near_draft, far_draft, shape, policy):
    plain = generate_plain(target, PROMPT, 40).token_ids
    for draft in (near_draft, far_draft):
        result = TreeDecoder(target, draft, make_policy(policy), shape, max_depth=6).generate(PROMPT, 40)
        assert result.token_ids == plain
        assert sum(r.emitted for r in result.rounds) == 40


def test_a_k1_tree_is_the_chain_decoder(target, near_draft):
    for depth in (1, 3, 5):
        chain = SpeculativeDecoder(target, near_draft, make_policy(f"static:{depth}"), max_depth=8).generate(PROMPT, 48)
        tree = TreeDecoder(target, near_draft, make_policy(f"static:{depth}"), TreeShape(1, 1, 64), max_depth=8).generate(PROMPT, 48)
        assert tree.token_ids == chain.token_ids
        assert [(r.drafted, r.verified, r.accepted, r.emitted) for r in tree.rounds] == [(r.drafted, r.verified, r.accepted, r.emitted) for r in chain.rounds]


def test_wider_trees_accept_more_with_a_poor_draft(target, far_draft):
    def tau(shape: TreeShape) -> float:
        return TreeDecoder(target, far_draft, make_policy("static:4"), shape, max_depth=4).generate(PROMPT, 64).mean_emitted

    assert tau(TreeShape(4, 4, 40)) > tau(TreeShape(1, 1, 4))


def test_caches_hold_only_context_and_accepted_path(target, near_draft):
    decoder = TreeDecoder(target, near_draft, make_policy("static:4"), TreeShape(3, 3, 12), max_depth=4)
    result = decoder.generate(PROMPT, 30)
    confirmed = PROMPT + result.token_ids
    assert decoder.target.length == len(confirmed) - 1
    fresh = CachedModel(target)
    fresh.forward(confirmed[:-1])
    for kept, plain in zip(decoder.target.cache.layers, fresh.cache.layers, strict=True):
        assert torch.allclose(kept.keys, plain.keys, atol=1e-10) and torch.allclose(kept.values, plain.values, atol=1e-10)


def test_reduced_vocabulary_draft_and_eos(target, subset_draft):
    plain = generate_plain(target, PROMPT, 30, eos_token_id=3)
    tree = TreeDecoder(target, subset_draft, make_policy("static:3"), TreeShape(4, 2, 10), eos_token_id=3).generate(PROMPT, 30)
    assert tree.token_ids == plain.token_ids and tree.stop_reason == plain.stop_reason


def test_bad_shapes_are_named():
    with pytest.raises(ValueError, match="branching"):
        TreeShape(0, 1, 1)
    with pytest.raises(ValueError, match="k,W,V|branching,width,size"):
        TreeShape.parse("4,4")


def test_a_float32_pair_also_matches(tmp_path):
    target32, draft32 = tiny_llama(3, dtype=torch.float32), tiny_llama(4, layers=1, dtype=torch.float32)
    plain = generate_plain(target32, PROMPT, 24).token_ids
    assert TreeDecoder(target32, draft32, make_policy("static:3"), TreeShape(3, 3, 12)).generate(PROMPT, 24).token_ids == plain


@pytest.mark.parametrize("shape,depth", [(TreeShape(2, 2, 6), 3), (TreeShape(3, 2, 12), 4), (TreeShape(1, 1, 8), 5)])
def test_tree_replay_reproduces_live_tree_rounds(target, far_draft, shape, depth, tmp_path):
    from conftest import flat_profile

    from adaptive.tree_traces import TreeTraceSet, record_trees
    from envs.rollout import run_policy
    from envs.tree_replay import TreeReplayBackend

    budget = 40
    prompts = [PROMPT, [3, 3, 8, 1], [12, 0, 5, 5, 5, 9, 2, 2]]
    outputs = [generate_plain(target, p, budget).token_ids for p in prompts]
    rows = [{"id": f"p{i}", "lang": "en"} for i in range(len(prompts))]
    traces = record_trees(target, far_draft, rows, prompts, outputs, shape, depth, {"max_new_tokens": budget})
    traces.save(tmp_path / "trees.npz")
    traces = TreeTraceSet.load(tmp_path / "trees.npz")
    for size in (1, 3, shape.size):
        backend = TreeReplayBackend(traces, flat_profile(), max_depth=depth, size=size)
        for gamma in (1, 2, depth):
            replayed = run_policy(backend, make_policy(f"static:{gamma}"), range(len(prompts)), 0.0)
            for prompt, episode in zip(prompts, replayed, strict=True):
                live = TreeDecoder(target, far_draft, make_policy(f"static:{gamma}"), TreeShape(shape.branching, shape.width, size), max_depth=depth)
                rounds = live.generate(prompt, budget).rounds
                assert [(c.drafted, c.verified, c.accepted, c.emitted) for c in episode.cycles] == [
                    (r.drafted, r.verified, r.accepted, r.emitted) for r in rounds
                ], (size, gamma)


@pytest.mark.parametrize("shape,policy", [(TreeShape(2, 2, 6), "static:3"), (TreeShape(3, 2, 5), "entropy:1.0")])
def test_sampled_tree_rounds_replay_exactly_along_their_output(target, far_draft, shape, policy):
    """At T > 0 a verified child is accepted exactly when its token is the one emitted there, so trees recorded along a
    sampled live output replay that generation's rounds exactly (hence, with outputs sampled from the target, exact
    in distribution)."""
    from conftest import flat_profile

    from adaptive.sampling import SamplingConfig
    from adaptive.tree_traces import record_trees
    from envs.rollout import run_policy
    from envs.tree_replay import TreeReplayBackend

    budget, prompts = 40, [PROMPT, [3, 3, 8, 1], [12, 0, 5, 5, 5, 9, 2, 2]]
    for sampling in (SamplingConfig(1.0), SamplingConfig(0.7, top_p=0.9)):
        decoder = TreeDecoder(target, far_draft, make_policy(policy), shape, sampling, max_depth=4)
        for seed in range(3):
            lives = [decoder.generate(p, budget, seed=seed * 10 + i) for i, p in enumerate(prompts)]
            rows = [{"id": f"p{i}", "lang": "en"} for i in range(len(prompts))]
            traces = record_trees(target, far_draft, rows, prompts, [r.token_ids for r in lives], shape, 4, {"max_new_tokens": budget})
            replayed = run_policy(TreeReplayBackend(traces, flat_profile(), max_depth=4), make_policy(policy), range(len(prompts)), 0.0)
            for live, episode in zip(lives, replayed, strict=True):
                assert [(c.drafted, c.verified, c.accepted, c.emitted) for c in episode.cycles] == [
                    (r.drafted, r.verified, r.accepted, r.emitted) for r in live.rounds
                ], (sampling, seed)
    assert any(r.accepted < r.drafted for r in lives[0].rounds) and any(r.accepted > 0 for live in lives for r in live.rounds)


class TreeWitness(StaticDepth):
    """static:3 that notes, at every decision, what the grown tree shows it."""

    def __init__(self) -> None:
        super().__init__(3)
        self.seen: list[tuple[int, tuple[float, ...], tuple[float, ...]]] = []

    def should_continue(self, state) -> bool:
        self.seen.append((state.depth, state.tree_ranked, state.tree_level_mass))
        return super().should_continue(state)


def test_replayed_tree_policies_see_what_the_live_tree_shows(target, far_draft, tiny_tree_traces):
    """At every depth decision, the grown tree's best nodes' cumulative probabilities (to the traces' 1/255) and each
    level's summed probability (to float16): replayed from format-3 tree traces as the tree decoder shows them live,
    and the observation's tree block built from them."""
    from conftest import flat_profile

    from adaptive.observation import TREE_RANKS, ObservationBuilder, ObservationSchema, tree_summary
    from adaptive.tree_traces import TreeTraceSet
    from envs.env import SpecDecodeEnv
    from envs.rollout import run_policy
    from envs.tree_replay import TreeReplayBackend

    traces = TreeTraceSet.load(tiny_tree_traces)
    assert traces.has_scores
    backend = TreeReplayBackend(traces, flat_profile(), max_depth=4, size=6)
    prompts = [[(7 * i + j) % 16 for j in range(5 + i % 4)] for i in range(3)]
    replayed = TreeWitness()
    run_policy(backend, replayed, range(3), 0.0)
    live = TreeWitness()
    for prompt in prompts:
        TreeDecoder(target, far_draft, live, TreeShape(3, 3, 6), max_depth=4).generate(prompt, 48)
    assert len(replayed.seen) == len(live.seen) > 20
    for (depth, ranked, mass), (live_depth, live_ranked, live_mass) in zip(replayed.seen, live.seen, strict=True):
        assert depth == live_depth and len(ranked) == min(TREE_RANKS, len(live_ranked)) and len(mass) == len(live_mass) == depth
        assert ranked == pytest.approx(live_ranked[:TREE_RANKS], abs=0.5 / 255 + 1e-6)
        assert mass == pytest.approx(live_mass, rel=1e-3)
    env = SpecDecodeEnv(TreeReplayBackend(traces, flat_profile(), max_depth=4, size=6))
    assert env.schema == ObservationSchema(4, version=5, tree=True)
    observation, _ = env.reset(options={"prompt": 0})
    ranked, mass = env.backend.tree_view()
    assert observation[-(TREE_RANKS + 4) :] == pytest.approx([*ranked, *[0.0] * (TREE_RANKS - 3), *mass, 0.0, 0.0, 0.0], abs=1e-6)
    assert len(ranked) == 3 and mass[0] == pytest.approx(sum(ranked), abs=2 / 255)  # one level: its k = 3 nodes
    summary = tree_summary([1, 2, 2, 1], [-0.5, -0.7, -3.0, -0.1])
    assert summary[0] == pytest.approx(np.exp([-0.1, -0.5, -0.7, -3.0]))
    assert summary[1] == pytest.approx([np.exp(-0.5) + np.exp(-0.1), np.exp(-0.7) + np.exp(-3.0)])
    builder = ObservationBuilder(env.schema, 0.1, [1.0, 1.1])
    builder.set_tree(*summary)
    block = builder.build(2, 4, 10)[-(TREE_RANKS + 4) :]
    assert block == pytest.approx([*summary[0], *[0.0] * (TREE_RANKS - 4), *summary[1], 0.0, 0.0])


def test_tree_traces_without_scores_replay_with_the_chain_observation():
    """Tree traces of format 2 (no node scores) still load and replay, with observation version 4; version 5 is refused
    with what to do."""
    from pathlib import Path

    from conftest import flat_profile

    from adaptive.tree_traces import TreeTraceSet
    from envs.env import SpecDecodeEnv
    from envs.tree_replay import TreeReplayBackend

    traces = TreeTraceSet.load(Path(__file__).resolve().parents[1] / "data" / "traces" / "smollm2-135m-test-tree.npz")
    assert not traces.has_scores
    backend = TreeReplayBackend(traces, flat_profile(), max_depth=6)
    assert SpecDecodeEnv(backend).schema.version == 4
    with pytest.raises(ValueError, match="re-record them with adaptive record --tree"):
        SpecDecodeEnv(backend, schema_version=5)


def test_the_tree_oracle_verifies_the_fewest_nodes_that_accept_the_most(tiny_tree_traces):
    """Per round, each depth's lookahead verifies the fewest nodes that accept the most the tree can (checked against
    the reference acceptance over every size), and the oracle takes the depth with the best modelled rate."""
    from conftest import flat_profile

    from adaptive.tree_traces import TreeTraceSet, accepted_in_tree
    from envs.rollout import run_policy
    from envs.tree_replay import TreeReplayBackend
    from policies.oracle import TreeOracle

    traces = TreeTraceSet.load(tiny_tree_traces)
    backend = TreeReplayBackend(traces, flat_profile(), max_depth=4, size=6)
    for prompt in range(len(traces)):
        backend.start_prompt(prompt)
        row = int(traces.offsets[prompt])
        for depth in range(1, 5):
            size, cycle = backend.tree_lookahead(depth)
            accepted = [accepted_in_tree(traces.rank[row], traces.depth[row], traces.on_path[row], depth, v) for v in range(1, backend.verifiable(depth) + 1)]
            assert cycle.accepted == max(accepted) and size == (accepted.index(max(accepted)) + 1 if max(accepted) else 1)
    oracle = sum(e.tokens / e.seconds for e in run_policy(backend, TreeOracle(backend), range(len(traces)), 0.0))
    for depth in range(1, 5):
        for size in (1, 3, 6, 12):
            backend.size = size
            assert oracle >= sum(e.tokens / e.seconds for e in run_policy(backend, StaticDepth(depth), range(len(traces)), 0.0)), (depth, size)


def test_tree_replay_prices_a_round_by_the_tree_profile_s_parts(target, near_draft, tiny_tree_traces):
    """A replayed tree round costs the profile's first draft step, a W-node forward per later level, the target's masked
    forward of the verified nodes and the tree decoder's own work, at the round's context."""
    from adaptive.profiling import profile_pair
    from adaptive.tree_traces import TreeTraceSet
    from envs.tree_replay import TreeReplayBackend

    profile = profile_pair(target, near_draft, max_verify=8, contexts=(8, 64), reference_context=8, repetitions=1, tree_mask=True, prefill_lengths=())
    backend = TreeReplayBackend(TreeTraceSet.load(tiny_tree_traces), profile, max_depth=3, size=5)
    backend.start_prompt(0)
    emitted = None
    for _ in range(3):
        context = backend.context_length
        backend.draft(), backend.draft(), backend.draft()
        cycle = backend.verify(5)
        assert cycle.draft_seconds == pytest.approx(profile.round_drafting_seconds(context, 3, emitted, tree=True))
        assert cycle.verify_seconds == pytest.approx(profile.round_verifying_seconds(context, 5, tree=True))
        assert cycle.draft_seconds > profile.drafting_seconds(context, 3, emitted) - profile.drafting_seconds(context, 1, emitted)
        emitted = cycle.accepted + 1


@pytest.fixture(scope="module")
def tiny_tree_traces(tmp_path_factory, target, far_draft):
    from adaptive.tree_traces import record_trees

    prompts = [[(7 * i + j) % 16 for j in range(5 + i % 4)] for i in range(12)]
    outputs = [generate_plain(target, p, 48).token_ids for p in prompts]
    rows = [{"id": f"p{i}", "lang": "en"} for i in range(len(prompts))]
    path = tmp_path_factory.mktemp("trees") / "tiny-tree.npz"
    record_trees(target, far_draft, rows, prompts, outputs, TreeShape(3, 3, 6), 4, {"max_new_tokens": 48}).save(path)
    return path


def test_tree_policies_train_cotrained_and_drive_the_tree_decoder(tiny_tree_traces, target, far_draft, tmp_path):
    from pathlib import Path

    from adaptive.learned_policy import load_policy
    from lab.config import config_from_dict
    from lab.environments import make_env, run_profile
    from lab.training import train

    root = Path(__file__).resolve().parents[1]
    config = config_from_dict(
        {
            "name": "tree",
            "seed": 0,
            "env": {
                "backend": "replay",
                "traces": str(tiny_tree_traces),
                "tree": True,
                "tree_size": 6,
                "max_depth": 4,
                "profile": str(root / "profiles" / "smollm2-135m-tree.json"),
            },
            "depth_policy": {"timesteps": 1024, "n_steps": 256, "batch_size": 64, "n_epochs": 2},
            "size_policy": {"timesteps": 512, "n_steps": 128, "batch_size": 64, "n_epochs": 2},
            "cotraining": {"rounds": 1, "train_size": True},
            "eval_episodes": 12,
            "tracking": {"wandb": "disabled"},
        }
    )
    assert make_env(config, "size", None, run_profile(config)).action_space.n == 3 + 3 * 9  # every node of a depth-4 (3, 3) tree
    train(config, tmp_path / "run")
    policy = load_policy(tmp_path / "run")
    assert policy.sizes_trees and policy.metadata["tree"] == {"branching": 3, "width": 3, "size": 6}
    assert policy.schema.tree and policy.schema.version == 5  # it saw the grown tree's node scores
    decoder = TreeDecoder(target, far_draft, policy, TreeShape(3, 3, 6), max_depth=4)
    result = decoder.generate(PROMPT, 40)
    assert result.token_ids == generate_plain(target, PROMPT, 40).token_ids
    assert all(1 <= r.verified <= 30 for r in result.rounds if r.drafted)


def test_tree_mode_needs_the_replay_backend():
    from lab.config import ConfigError, config_from_dict

    with pytest.raises(ConfigError, match="env.tree"):
        config_from_dict({"env": {"backend": "live", "tree": True}})


def test_the_replay_table_agrees_with_the_reference_acceptance_on_shipped_traces():
    from pathlib import Path

    from adaptive.tree_traces import TreeTraceSet, accepted_in_tree, nodes_needed

    traces = TreeTraceSet.load(Path(__file__).resolve().parents[1] / "data" / "traces" / "smollm2-135m-test-tree.npz")
    rows = range(0, int(traces.offsets[-1]), 37)
    need = nodes_needed(traces.rank[rows], traces.depth[rows], traces.on_path[rows], traces.max_depth)
    for k, row in enumerate(rows):
        for d in range(1, traces.max_depth + 1):
            for size in (1, 2, 3, 5, 8, 13, 40):
                fast = int((need[k, d - 1, :d] <= size).sum())
                assert fast == accepted_in_tree(traces.rank[row], traces.depth[row], traces.on_path[row], d, size), (row, d, size)


def test_the_tree_decoder_has_the_chain_decoders_step_api(target, near_draft):
    """Driving a tree generation by hand (start / draft_step / choose_size / verify) gives the rounds the
    decoder's own policy loop gives."""
    shape = TreeShape(3, 2, 6)
    decoder = TreeDecoder(target, near_draft, make_policy("static:3"), shape, max_depth=5)
    expected = decoder.generate(PROMPT, 24)
    generation = decoder.start(PROMPT, 24)
    rounds = []
    while not generation.done:
        while generation.depth < min(3, generation.max_depth):
            step = generation.draft_step()
            assert step.token == generation.tree.best_at(generation.depth).token
        state = generation.end_drafting()
        assert state.depth == generation.depth and len(state.steps) == state.depth
        rounds.append(generation.verify(generation.choose_size(decoder.policy, state)))
    assert [r.tokens for r in rounds] == [r.tokens for r in expected.rounds]
    assert [(r.drafted, r.verified, r.accepted) for r in rounds] == [(r.drafted, r.verified, r.accepted) for r in expected.rounds]
    with pytest.raises(ValueError, match="cap"):
        generation = decoder.start(PROMPT, 2)  # a 2-token budget caps the round at depth 1
        generation.draft_step()
        generation.draft_step()


def test_a_tree_round_is_rejected_only_when_its_path_stops_short_of_the_trees_depth(target, near_draft):
    rounds = TreeDecoder(target, near_draft, make_policy("static:4"), TreeShape(4, 4, 12), max_depth=4).generate(PROMPT, 48).rounds
    assert any(r.verified > r.drafted for r in rounds)  # more nodes verified than a path can hold
    assert [r.rejected for r in rounds] == [r.accepted < r.drafted for r in rounds]
    assert any(r.rejected for r in rounds) and any(not r.rejected and r.accepted < r.verified for r in rounds)
    chain = SpeculativeDecoder(target, near_draft, make_policy("static:4"), max_depth=4).generate(PROMPT, 48).rounds
    assert [r.rejected for r in chain] == [r.accepted < r.verified for r in chain]


def test_ranking_children_over_the_draft_vocabulary_equals_ranking_over_the_full_one(subset_draft):
    from conftest import SUBSET

    from adaptive.tree import rank_children

    assert CachedModel(subset_draft).vocabulary.tolist() == SUBSET
    logits = CachedModel(subset_draft).forward(PROMPT)
    full, reduced = rank_children(logits, 3), rank_children(logits, 3, torch.tensor(SUBSET))
    assert reduced[0] == full[0] and all(set(tokens) <= set(SUBSET) for tokens in reduced[0])
    for a, b in zip(full[1:], reduced[1:]):
        assert torch.allclose(torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64), atol=1e-12)


def test_trees_are_recorded_only_on_the_engine_their_outputs_were_sampled_on(target, near_draft):
    """The draft may read the target's states, so trees grown on another engine than the outputs' would not be the ones
    the live decoder grows along them: the recorder refuses, naming both engines."""
    from pathlib import Path

    from adaptive.pair import ModelPair
    from lab.recording import record_tree_traces

    chains = Path(__file__).resolve().parents[1] / "data" / "traces" / "smollm2-135m-test-compiled-int4.npz"
    with pytest.raises(ValueError, match="engine 'compiled-int4'.*--engine compiled-int4.*not 'eager'"):
        record_tree_traces(ModelPair(target, near_draft, None, "tiny"), "tiny", chains, split="test", dtype="float64", shape=TreeShape(2, 2, 4), depth=2)
