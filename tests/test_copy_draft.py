"""The copy drafter: its suffix index against brute force, rollback, and decoding with it (greedy identity,
no-match rounds, the tree decoder's refusal). Exactness at T > 0: tests/test_decoder_exactness.py."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch
from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

from adaptive import SamplingConfig, SpeculativeDecoder, generate_plain
from adaptive.copy_draft import CopyDraft, CopySession, PromptLookupDraft, PromptLookupSession, SuffixIndex
from adaptive.policy import DraftState, DraftStep
from adaptive.tree_decoder import TreeDecoder
from policies import StaticDepth, SuffixRule, make_policy


def occurrences(stream: list[int], pattern: list[int]) -> int:
    n = len(pattern)
    return sum(stream[i : i + n] == pattern for i in range(len(stream) - n + 1))


def brute_force_proposal(stream: list[int], max_match: int, min_match: int) -> tuple[int, int | None]:
    """(match length, proposed token) by scanning: the longest suffix of ``stream`` (min..max tokens) that
    occurred earlier with a follower; its most frequent follower, ties to the one that followed most recently."""
    for m in range(min(max_match, len(stream) - 1), min_match - 1, -1):
        suffix = stream[len(stream) - m :]
        followers = [stream[i + m] for i in range(len(stream) - m) if stream[i : i + m] == suffix]
        if followers:
            counts = {t: followers.count(t) for t in followers}
            best = max(counts.values())
            return m, next(t for t in reversed(followers) if counts[t] == best)
    return 0, None


def random_stream(rng: random.Random, length: int, alphabet: int) -> list[int]:
    """Text with copies: random tokens, and now and then a span copied from earlier."""
    stream: list[int] = []
    while len(stream) < length:
        if stream and rng.random() < 0.3:
            start = rng.randrange(len(stream))
            stream += stream[start : start + rng.randint(2, 8)]
        else:
            stream.append(rng.randrange(alphabet))
    return stream[:length]


def test_index_counts_every_suffix_occurrence():
    rng = random.Random(0)
    stream = random_stream(rng, 120, 5)
    index = SuffixIndex(depth=4)
    for token in stream:
        index.append(token)
    checked = 0
    for start in range(len(stream)):
        for n in range(1, 5):
            pattern = stream[start : start + n]
            if len(pattern) < n:
                continue
            node = 0
            for token in pattern:
                node = index.children[node][token]
            assert index.count[node] == occurrences(stream, pattern), pattern
            checked += 1
    assert checked > 400


def test_pop_undoes_append_exactly():
    rng = random.Random(1)
    stream = random_stream(rng, 80, 4)
    index = SuffixIndex(depth=5)
    for token in stream[:50]:
        index.append(token)
    snapshot = ([dict(c) for c in index.children], list(index.count), list(index.recent), list(index.ending))
    for token in stream[50:]:
        index.append(token)
    for _ in stream[50:]:
        index.pop()
    assert ([dict(c) for c in index.children], index.count, index.recent, index.ending) == snapshot
    assert index.length == 50


@pytest.mark.parametrize(("max_match", "min_match"), [(16, 1), (3, 1), (6, 2)])
def test_proposals_and_match_lengths_equal_brute_force(max_match, min_match):
    rng = random.Random(max_match + min_match)
    stream = random_stream(rng, 200, 6)
    session = CopySession(CopyDraft(max_match, min_match), vocab_size=6, device=torch.device("cpu"))
    rows = session.forward(stream)
    for t in range(len(stream)):
        length, token = brute_force_proposal(stream[: t + 1], max_match, min_match)
        assert session.match_lengths[t] == length, t
        if token is None:
            assert torch.isneginf(rows[t]).all(), t
        else:
            assert int(rows[t].argmax()) == token, t


def test_rows_are_log_frequencies_of_the_continuations():
    session = CopySession(CopyDraft(), vocab_size=8, device=torch.device("cpu"))
    row = session.forward([1, 2, 1, 3, 1, 2, 1])[-1]  # "1 2 1" was followed by 3
    assert session.match_lengths[-1] == 3
    probabilities = torch.softmax(row, dim=-1)
    assert probabilities[3] == pytest.approx(1.0)
    row = session.forward([4, 1])[-1]  # "4 1" is new; "1" was followed by 2, 3, 2, 4
    assert session.match_lengths[-1] == 1
    probabilities = torch.softmax(row, dim=-1)
    assert probabilities[[2, 3, 4]].tolist() == pytest.approx([0.5, 0.25, 0.25], abs=1e-5)


def test_rolled_back_session_equals_a_fresh_one():
    rng = random.Random(3)
    stream = random_stream(rng, 90, 5)
    session = CopySession(CopyDraft(8), vocab_size=5, device=torch.device("cpu"))
    session.forward(stream)
    session.rollback(40)
    again = session.forward(stream[40:])
    fresh = CopySession(CopyDraft(8), vocab_size=5, device=torch.device("cpu"))
    assert torch.equal(again, fresh.forward(stream)[40:])
    with pytest.raises(ValueError, match="cannot roll back to length 91"):
        session.rollback(91)


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="min_match=3, max_match=2"):
        CopyDraft(max_match=2, min_match=3)


@pytest.mark.parametrize("spec", ["static:1", "static:4", "static:8", "heuristic", "confidence"])
def test_greedy_output_is_identical_to_plain_greedy(spec, target):
    decoder = SpeculativeDecoder(target, CopyDraft(), make_policy(spec))
    for prompt in ([5], [1, 2, 3], [7, 7, 7, 7, 7, 7, 7, 7], [15, 0, 9, 4, 2, 11, 15, 0, 9]):
        for length in (1, 7, 40):
            expected = generate_plain(target, prompt, length).token_ids
            assert decoder.generate(prompt, length).token_ids == expected, (prompt, length)


def test_rounds_without_a_match_are_plain_steps_and_copies_get_accepted(target):
    result = SpeculativeDecoder(target, CopyDraft(min_match=2), StaticDepth(4)).generate([1, 2, 3], 60)
    assert result.token_ids == generate_plain(target, [1, 2, 3], 60).token_ids
    assert result.rounds[0].drafted == 0 and result.rounds[0].emitted == 1  # "2 3" never occurred before
    assert any(r.drafted for r in result.rounds)
    assert sum(r.accepted for r in result.rounds) > 0  # the tiny target repeats itself; the drafter copies it


def test_the_tree_decoder_refuses_the_copy_drafter(target):
    with pytest.raises(ValueError, match="CopyDraft drafts chains only"):
        TreeDecoder(target, CopyDraft(), StaticDepth(2))


def lookup_round(session: PromptLookupSession, context: list[int]) -> list[int]:
    """What the session proposes in one round after ``context``, fed its own proposals as a decoder does."""
    session.reset()
    session.forward(context[:-1])
    session.begin_round()
    proposal, row = [], session.forward(context[-1:])[-1]
    while torch.isfinite(row).any():
        proposal.append(int(row.argmax()))
        row = session.forward(proposal[-1:])[-1]
    return proposal


@pytest.mark.parametrize(("max_ngram", "num_tokens"), [(2, 10), (3, 4), (1, 6)])
def test_prompt_lookup_proposes_what_transformers_prompt_lookup_proposes(max_ngram, num_tokens):
    rng = random.Random(max_ngram * 10 + num_tokens)
    reference = PromptLookupCandidateGenerator(num_output_tokens=num_tokens, max_matching_ngram_size=max_ngram, max_length=10_000)
    session = PromptLookupSession(PromptLookupDraft(max_ngram, num_tokens), vocab_size=7, device=torch.device("cpu"))
    stream = random_stream(rng, 150, 7)
    proposed = 0
    for t in range(2, len(stream)):
        candidates, _ = reference.get_candidates(torch.tensor([stream[:t]]))
        expected = candidates[0, t:].tolist()
        assert lookup_round(session, stream[:t]) == expected, t
        proposed += bool(expected)
    assert proposed > 100


def test_prompt_lookup_decodes_greedy_identically_and_samples(target):
    prompt = [15, 0, 9, 4, 2, 11, 15, 0, 9]
    decoder = SpeculativeDecoder(target, PromptLookupDraft(), StaticDepth(10))
    result = decoder.generate(prompt, 40)
    assert result.token_ids == generate_plain(target, prompt, 40).token_ids
    assert result.rounds[0].drafted == 6  # "0 9" first occurred at 1, followed by the 6 tokens up to the prompt's end
    sampled = SpeculativeDecoder(target, PromptLookupDraft(), StaticDepth(10), SamplingConfig(1.0)).generate(prompt, 30, seed=3)
    assert len(sampled.token_ids) == 30


def copy_steps(probabilities: list[float], match: int) -> tuple[DraftStep, ...]:
    steps, cumulative = [], 0.0
    for p in probabilities:
        cumulative += math.log(p)
        steps.append(DraftStep(0, p, 0.0, math.log(p), cumulative, match))
    return tuple(steps)


def test_suffix_rule_drafts_up_to_the_match_length_times_the_factor_and_stops_below_the_floor():
    rule = SuffixRule(factor=1.0, offset=0.0, min_prob=0.1)
    state = lambda probabilities, match: DraftState(20, copy_steps(probabilities, match), 16)  # noqa: E731
    assert rule.should_continue(state([0.9, 0.9], match=3))
    assert not rule.should_continue(state([0.9, 0.9, 0.9], match=3))  # ⌊3 · 1.0⌋ drafted
    assert rule.should_continue(state([0.5, 0.3], match=8))  # estimated probability 0.15
    assert not rule.should_continue(state([0.5, 0.3, 0.5], match=8))  # 0.075 < 0.1: stop, and leave it out
    assert rule.verify_size(state([0.5, 0.3, 0.5], match=8)) == 2
    assert rule.verify_size(state([0.05], match=8)) == 1
    assert SuffixRule(factor=0.5, offset=1.0).should_continue(state([0.9], match=2))  # ⌊2 · 0.5 + 1⌋ = 2
    with pytest.raises(ValueError, match="min_prob=0"):
        SuffixRule(min_prob=0.0)


def test_suffix_rule_with_the_copy_drafter_is_greedy_identical(target):
    prompt = [15, 0, 9, 4, 2, 11, 15, 0, 9]
    result = SpeculativeDecoder(target, CopyDraft(), SuffixRule()).generate(prompt, 40)
    assert result.token_ids == generate_plain(target, prompt, 40).token_ids
    first = result.rounds[0]
    assert first.drafted == 3  # "15 0 9" matched: at most 3 tokens


@pytest.mark.parametrize("source", ["model", "copy", "copy+model"])
@pytest.mark.parametrize("draft_name", ["near_draft", "far_draft"])
def test_a_copy_drafter_beside_the_model_keeps_greedy_output_identical(source, draft_name, target, request):
    decoder = SpeculativeDecoder(target, request.getfixturevalue(draft_name), StaticDepth(5, source), copy=CopyDraft())
    for prompt in ([5], [1, 2, 3], [15, 0, 9, 4, 2, 11, 15, 0, 9]):
        for length in (1, 7, 40):
            result = decoder.generate(prompt, length)
            assert result.token_ids == generate_plain(target, prompt, length).token_ids, (prompt, length)
            assert {r.source for r in result.rounds} <= {source}


def test_copy_then_model_rounds_draft_past_the_copy_drafters_proposals(target, near_draft):
    prompt = [15, 0, 9, 4, 2, 11, 15, 0, 9]
    copy_only = SpeculativeDecoder(target, near_draft, StaticDepth(8, "copy"), copy=CopyDraft(min_match=3)).generate(prompt, 40)
    mixed = SpeculativeDecoder(target, near_draft, StaticDepth(8, "copy+model"), copy=CopyDraft(min_match=3)).generate(prompt, 40)
    assert any(r.drafted < 8 for r in copy_only.rounds[:-2])  # the copy drafter ran out of proposals
    assert all(r.drafted == min(8, 40 - sum(x.emitted for x in mixed.rounds[:i]) - 1) for i, r in enumerate(mixed.rounds))
    assert [s.match_length > 0 for s in mixed.rounds[0].steps][:3] == [True, True, True]  # "15 0 9" copied first


def test_a_copy_drafter_beside_a_copy_drafter_is_refused(target):
    with pytest.raises(ValueError, match="already a model-free drafter"):
        SpeculativeDecoder(target, CopyDraft(), StaticDepth(2), copy=CopyDraft())


COPY_PROMPTS = [[15, 0, 9, 4, 2, 11, 15, 0, 9], [1, 2, 3, 1, 2], [7, 7, 7, 7]]


@pytest.fixture(scope="module")
def copy_traces(target, near_draft):
    from adaptive.recorder import record

    decoder = SpeculativeDecoder(target, near_draft, StaticDepth(1))
    rows = [{"id": str(i), "lang": "en"} for i in range(len(COPY_PROMPTS))]
    return record(decoder, rows, COPY_PROMPTS, 40, depth=8, metadata={}, copy=CopyDraft())


def test_copy_traces_record_the_copy_drafters_chain_at_every_position(copy_traces):
    copy = copy_traces.copy
    assert copy is not None and copy.features.shape == copy_traces.features.shape
    assert (copy.match <= copy.available).all() and (copy.available <= 8).all()
    assert copy.available.sum() > 0 and copy.match.sum() > 0
    step = np.arange(8)[None, :]
    assert ((copy.lengths > 0) == (step < copy.available[:, None])).all()  # a match length behind every proposal


@pytest.mark.parametrize("spec", ["static:3", "static:3:copy", "static:8:copy", "static:4:copy+model", "suffix"])
def test_replay_of_copy_sources_reproduces_live_rounds(copy_traces, target, near_draft, spec):
    """Drafted, verified, accepted and emitted tokens of every round equal the live decoder's with the near
    draft and a copy drafter beside it (the suffix rule decides on the replayed features and match lengths)."""
    from conftest import flat_profile

    from envs.replay import ReplayBackend
    from envs.rollout import run_policy

    backend = ReplayBackend(copy_traces, flat_profile(), max_depth=8)
    assert backend.sources == ("model", "copy", "copy+model")
    episodes = run_policy(backend, make_policy(spec), list(range(len(COPY_PROMPTS))), decision_seconds=0.0)
    decoder = SpeculativeDecoder(target, near_draft, make_policy(spec), max_depth=8, copy=CopyDraft())
    for prompt, episode in zip(COPY_PROMPTS, episodes):
        live = decoder.generate(prompt, 40).rounds
        assert [(c.drafted, c.verified, c.accepted, c.emitted) for c in episode.cycles] == [(r.drafted, r.verified, r.accepted, r.emitted) for r in live], (
            prompt,
            spec,
        )


class SourceSpy(StaticDepth):
    """static:4 drafting with the copy drafter, noting what each source decision is shown."""

    def __init__(self) -> None:
        super().__init__(4, source="copy")
        self.shown: list[tuple[int, int, tuple[float, float]]] = []

    def source(self, state: DraftState) -> str:
        self.shown.append((state.context_length, state.copy_match, state.copy_first))
        return super().source(state)


def test_a_source_decision_is_shown_the_copy_drafters_first_proposal_alike_live_and_in_replay(copy_traces, target, near_draft):
    """Before a round drafts, the policy sees the copy drafter's match length and its first proposal's share
    and entropy: read from the session live, from the recorded chain in replay, the same at every round."""
    from conftest import flat_profile

    from envs.replay import ReplayBackend
    from envs.rollout import run_policy

    replayed, live = SourceSpy(), SourceSpy()
    run_policy(ReplayBackend(copy_traces, flat_profile(), max_depth=8), replayed, list(range(len(COPY_PROMPTS))), decision_seconds=0.0)
    decoder = SpeculativeDecoder(target, near_draft, live, max_depth=8, copy=CopyDraft())
    for prompt in COPY_PROMPTS:
        decoder.generate(prompt, 40)
    assert [(n, m) for n, m, _ in replayed.shown] == [(n, m) for n, m, _ in live.shown]
    np.testing.assert_allclose([f for *_, f in replayed.shown], [f for *_, f in live.shown], atol=2e-3)
    shares = [share for _, match, (share, _) in live.shown if match]
    assert shares and all(0.0 < share <= 1.0 for share in shares) and any(share < 1.0 for share in shares)
    assert all(first == (0.0, 0.0) for _, match, first in live.shown if not match)


def test_replay_of_prompt_lookup_chains_reproduces_live_prompt_lookup(copy_traces, target):
    """The prompt-lookup chains recorded beside the copy drafter's, replayed as the copy source at the depth
    cap, give the rounds of live decoding with transformers' prompt lookup as the draft."""
    from conftest import flat_profile

    from envs.replay import ReplayBackend
    from envs.rollout import run_policy

    lookup = copy_traces.with_lookup_as_copy()
    assert lookup.copy is copy_traces.lookup and lookup.lookup is None
    episodes = run_policy(ReplayBackend(lookup, flat_profile(), max_depth=8), make_policy("static:8:copy"), list(range(len(COPY_PROMPTS))), 0.0)
    decoder = SpeculativeDecoder(target, PromptLookupDraft(num_tokens=8), make_policy("static:8"), max_depth=8)
    rounds = [[(c.drafted, c.accepted, c.emitted) for c in e.cycles] for e in episodes]
    assert rounds == [[(r.drafted, r.accepted, r.emitted) for r in decoder.generate(p, 40).rounds] for p in COPY_PROMPTS]
    assert sum(c.accepted for e in episodes for c in e.cycles) > 0


def test_copy_traces_survive_a_file_round_trip(copy_traces, tmp_path):
    from adaptive.traces import TraceSet

    copy_traces.save(tmp_path / "t.npz")
    loaded = TraceSet.load(tmp_path / "t.npz")
    assert np.array_equal(loaded.copy.match, copy_traces.copy.match)
    assert np.array_equal(loaded.copy.lengths, copy_traces.copy.lengths)
    assert np.allclose(loaded.copy.features, copy_traces.copy.features, atol=1e-2)
    assert np.array_equal(loaded.lookup.available, copy_traces.lookup.available)


def test_source_decisions_pass_the_gymnasium_checker_and_refuse_a_backend_without_a_copy_drafter(copy_traces):
    from conftest import flat_profile
    from gymnasium.utils.env_checker import check_env

    from envs.env import SpecDecodeEnv
    from envs.replay import ReplayBackend

    env = SpecDecodeEnv(ReplayBackend(copy_traces, flat_profile(), max_depth=8), "source", partner=make_policy("static:4"))
    assert env.action_space.n == 3 and env.schema.version == 4
    check_env(env, skip_render_check=True)
    observation, _ = env.reset(seed=0, options={"prompt": 0})
    _, reward, terminated, _, info = env.step(1)  # the copy drafter drafts the round, up to the partner's 4
    assert terminated and reward > 0 and 1 <= info["drafted"] <= 4
    with pytest.raises(ValueError, match="source decisions need"):
        SpecDecodeEnv(ReplayBackend(copy_traces, flat_profile(), max_depth=8, copy=False), "source")
