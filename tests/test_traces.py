"""Trace recording: the batched, shared-prefix recorder equals drafting each position one step at a time."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from adaptive.cached_model import CachedModel
from adaptive.decoder import SpeculativeDecoder, generate_plain
from adaptive.recorder import draft_trace, greedy_output, record
from adaptive.sampling import draft_features
from adaptive.traces import TraceSet
from policies import make_policy

PROMPTS = [[1, 4, 6], [9, 2, 2, 5, 11], [3]]


def sequential_trace(draft, prompt, output, depth):
    """The definition: at every t, draft `depth` greedy tokens after prompt + y[:t], one cached step at a time."""
    model = CachedModel(draft)
    features, match = np.zeros((len(output), depth, 3)), np.zeros(len(output), dtype=int)
    for t in range(len(output)):
        model.reset()
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


@pytest.mark.parametrize("draft_name", ["near_draft", "subset_draft"])
def test_recorder_equals_one_position_at_a_time(request, target, draft_name):
    draft = request.getfixturevalue(draft_name)
    for prompt in PROMPTS:
        output = generate_plain(target, prompt, 30).token_ids
        match, features = draft_trace(draft, prompt, output, depth=5)
        expected_match, expected_features = sequential_trace(draft, prompt, output, 5)
        assert match.tolist() == expected_match.tolist()
        np.testing.assert_allclose(features, expected_features, atol=1e-9)
        assert match.max() >= 2  # the test covers chained continuations


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
