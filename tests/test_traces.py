"""Trace recording: the batched, shared-prefix recorder equals drafting each position one step at a time."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import flat_profile

from adaptive.cached_model import CachedModel
from adaptive.decoder import SpeculativeDecoder, generate_plain
from adaptive.drafts import draft_session, target_taps
from adaptive.recorder import draft_trace, greedy_output, record, sampled_trace
from adaptive.sampling import SamplingConfig, draft_features, sampling_distribution
from adaptive.traces import TraceSet
from policies import make_policy

PROMPTS = [[1, 4, 6], [9, 2, 2, 5, 11], [3]]


def sequential_trace(target, draft, prompt, output, depth):
    """The definition: at every t, draft `depth` greedy tokens after prompt + y[:t], one cached step at a time
    (a head reading the target's states of that context only)."""
    features, match = np.zeros((len(output), depth, 3)), np.zeros(len(output), dtype=int)
    for t in range(len(output)):
        reading = CachedModel(target, taps=target_taps(draft))
        if reading.taps:
            reading.forward((prompt + output[:t])[:-1])
        model = draft_session(draft, reading)
        feed, tokens = prompt + output[:t], []
        for j in range(depth):
            token, *feats = draft_features(model.forward(feed)[-1:])[0]
            features[t, j] = feats
            tokens.append(token)
            feed = [token]
        rest = output[t:]
        while match[t] < min(depth, len(rest)) and tokens[match[t]] == rest[match[t]]:
            match[t] += 1
    return match, features


@pytest.mark.parametrize("draft_name", ["near_draft", "subset_draft", "eagle_head"])
def test_recorder_equals_one_position_at_a_time(request, target, draft_name):
    draft = request.getfixturevalue(draft_name)
    for prompt in PROMPTS if draft_name != "eagle_head" else PROMPTS[:2]:  # a head drafts after two tokens or more
        output = generate_plain(target, prompt, 30).token_ids
        match, features = draft_trace(target, draft, prompt, output, depth=5)
        expected_match, expected_features = sequential_trace(target, draft, prompt, output, 5)
        assert match.tolist() == expected_match.tolist()
        np.testing.assert_allclose(features, expected_features, atol=1e-9)
        assert match.max() >= (2 if draft_name != "eagle_head" else 1)  # chained continuations (the random head hits rarely)


def test_given_outputs_are_kept_when_right_and_repaired_when_wrong(target, near_draft):
    decoder = SpeculativeDecoder(target, near_draft, make_policy("static:3"))
    truth = generate_plain(target, PROMPTS[0], 20).token_ids
    assert greedy_output(decoder, PROMPTS[0], 20, truth) == truth
    wrong = truth[:7] + [(truth[7] + 1) % 16] + truth[8:]
    assert greedy_output(decoder, PROMPTS[0], 20, wrong) == truth
    assert greedy_output(decoder, PROMPTS[0], 20) == truth


def test_trace_file_round_trip(tmp_path, target, near_draft):
    decoder = SpeculativeDecoder(target, near_draft, make_policy("static:3"))
    rows = [{"id": f"p{i}", "lang": "en"} for i in range(len(PROMPTS))]
    traces = record(decoder, rows, PROMPTS, max_new_tokens=12, depth=4, metadata={"pair": "tiny"})
    traces.save(tmp_path / "t.npz")
    loaded = TraceSet.load(tmp_path / "t.npz")
    assert loaded.prompt_ids == ["p0", "p1", "p2"] and loaded.depth == 4 and loaded.max_new_tokens == 12
    assert loaded.output(1).tolist() == generate_plain(target, PROMPTS[1], 12).token_ids
    assert loaded.metadata["pair"] == "tiny" and loaded.metadata["sampling"] == "greedy"
    np.testing.assert_allclose(loaded.features, traces.features, atol=1e-3)  # stored as float16
    with np.load(tmp_path / "t.npz", allow_pickle=False) as raw:
        assert all(raw[key].dtype != object for key in raw.files)


def test_sampled_trace_acceptance_probabilities_follow_the_definition(target, far_draft):
    sampling = SamplingConfig(0.9, top_k=10)
    prompt, output = PROMPTS[1], generate_plain(target, PROMPTS[1], 12, sampling, seed=0).token_ids
    generator = torch.Generator().manual_seed(0)
    accept, features, tokens = sampled_trace(target, far_draft, prompt, output, 4, sampling, generator)
    assert accept.shape == tokens.shape == (12, 4) and features.shape == (12, 4, 3)
    for t in (0, 5, 11):
        context = prompt + output[:t]
        for j in range(4):
            ids = torch.tensor([context + tokens[t, :j].tolist()])
            with torch.no_grad():
                p = sampling_distribution(target(ids).logits[0, -1], sampling)
                q = sampling_distribution(far_draft(ids).logits[0, -1], sampling)
            x = int(tokens[t, j])
            assert q[x] > 0
            assert accept[t, j] == pytest.approx(min(1.0, float(p[x] / q[x])), abs=1e-5)
    assert 0.0 < accept.mean() < 1.0


def test_sampled_traces_replay_with_sampled_acceptances(tmp_path, target, far_draft):
    from envs.replay import ReplayBackend
    from envs.rollout import run_policy

    decoder = SpeculativeDecoder(target, far_draft, make_policy("static:1"), SamplingConfig(1.0))
    rows = [{"id": str(i), "lang": "en"} for i in range(len(PROMPTS))]
    traces = record(decoder, rows, PROMPTS, max_new_tokens=30, depth=4, metadata={}, seed=5)
    traces.save(tmp_path / "s.npz")
    loaded = TraceSet.load(tmp_path / "s.npz")
    assert loaded.sampled and loaded.metadata["temperature"] == 1.0
    backend = ReplayBackend(loaded, flat_profile())
    with pytest.raises(ValueError, match="greedy"):
        _ = backend.match_length
    episodes = run_policy(backend, make_policy("static:4"), range(len(PROMPTS)))
    accepted = [c.accepted for e in episodes for c in e.cycles]
    assert 0 < sum(accepted) and max(accepted) <= 4
    assert sum(e.tokens for e in episodes) == int(loaded.offsets[-1])
