"""Trace recording: the batched, shared-prefix recorder equals drafting each position one step at a time."""

from __future__ import annotations

import dataclasses
import json
import math
from collections import Counter

import numpy as np
import pytest
import torch
from conftest import flat_profile

from adaptive.cached_model import CachedModel
from adaptive.decoder import SpeculativeDecoder, generate_plain
from adaptive.drafts import draft_session, target_taps
from adaptive.recorder import draft_trace, greedy_output, record, sampled_trace
from adaptive.sampling import SamplingConfig, draft_features, sampling_distribution
from adaptive.traces import TraceSet, write_npz
from envs.replay import ReplayBackend
from envs.rollout import run_policy
from policies import make_policy

PROMPTS = [[1, 4, 6], [9, 2, 2, 5, 11], [3]]


def sequential_trace(target, draft, prompt, output, depth):
    """The definition: at every t, draft `depth` greedy tokens after prompt + y[:t], one cached step at a time
    (a head reading the target's states of that context only)."""
    features, match = np.zeros((len(output), depth, 4)), np.zeros(len(output), dtype=int)
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


def test_known_outputs_are_read_from_a_file_or_a_folder_of_shards(tmp_path):
    from lab.recording import known_outputs

    shards = tmp_path / "outputs"
    shards.mkdir()
    (shards / "greedy-00000.jsonl").write_text(json.dumps({"id": "a", "lang": "en", "response": [1, 2]}) + "\n")
    (shards / "greedy-00001.jsonl").write_text(json.dumps({"id": "b", "response": [3]}) + "\n" + json.dumps({"id": "c", "response": []}) + "\n")
    assert known_outputs(shards) == {"a": [1, 2], "b": [3], "c": []}
    assert known_outputs(shards / "greedy-00001.jsonl") == {"b": [3], "c": []}
    with pytest.raises(FileNotFoundError, match="missing is neither"):
        known_outputs(tmp_path / "missing")


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


def test_sampled_trace_records_acceptance_given_the_output_and_the_rejection_law(target, far_draft):
    """a_j = min(1, q_j(o_j) / p_j(o_j)); features of proposing o_j along the output; a rejected proposal whose
    empirical law over positions with the same context matches norm(max(q - p, 0))."""
    sampling = SamplingConfig(0.9, top_k=10)
    prompt, output = PROMPTS[1], generate_plain(target, PROMPTS[1], 12, sampling, seed=0).token_ids
    accept, accepting, rejecting = sampled_trace(target, far_draft, prompt, output, 4, sampling, torch.Generator().manual_seed(0))
    assert accept.shape == (12,) and accepting.shape == rejecting.shape == (12, 4, 4)
    for t in range(12):
        ids = torch.tensor([prompt + output[:t]])
        with torch.no_grad():
            p = sampling_distribution(target(ids).logits[0, -1], sampling)
            draft_logits = far_draft(ids).logits[0, -1]
        q = sampling_distribution(draft_logits, sampling)
        o = output[t]
        assert accept[t] == pytest.approx(min(1.0, float(q[o] / p[o])), abs=1e-6)
        expected = draft_features(draft_logits[None], torch.tensor([o]))[0][1:]
        np.testing.assert_allclose(accepting[t, 0], expected, atol=1e-5)
        if t >= 1:
            np.testing.assert_allclose(accepting[t - 1, 1], expected, atol=1e-5)  # step 2 of a round at t - 1 proposes o_t
        excess = torch.clamp(q - p, min=0)
        if float(excess.sum()) > 1e-6:  # the rejected proposal is a token the draft favours more than the target
            log_q = torch.log_softmax(draft_logits.double(), -1)
            assert any(abs(float(log_q[x]) - float(rejecting[t, 0, 2])) < 1e-5 for x in torch.nonzero(excess > 0)[:, 0].tolist())
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


CHI2_999 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 6: 22.46, 7: 24.32, 8: 26.12, 9: 27.88, 10: 29.59}
"""99.9 % quantiles of the chi-squared distribution by degrees of freedom."""


def chi2_two_samples(a: Counter, b: Counter) -> tuple[float, int]:
    """Two-sample chi-squared statistic of two histograms (bins with fewer than 10 counts in both pooled), and its degrees of freedom."""
    keys = sorted(set(a) | set(b))
    big = [k for k in keys if a[k] + b[k] >= 10]
    small = [k for k in keys if k not in big]
    rows = [(a[k], b[k]) for k in big] + ([(sum(a[k] for k in small), sum(b[k] for k in small))] if small else [])
    na, nb = sum(x for x, _ in rows), sum(y for _, y in rows)
    k1, k2 = math.sqrt(nb / na), math.sqrt(na / nb)
    return sum((x * k1 - y * k2) ** 2 / (x + y) for x, y in rows if x + y), len(rows) - 1


@pytest.fixture(scope="module")
def sampled_runs(target, far_draft):
    """300 sampled outputs of one prompt recorded as traces, and 300 live generations per policy (T = 1)."""
    sampling, prompt, n = SamplingConfig(1.0), [9, 2, 2, 5, 11], 300
    recorder = SpeculativeDecoder(target, far_draft, make_policy("static:1"), sampling)
    traces = record(recorder, [{"id": str(i), "lang": "en"} for i in range(n)], [prompt] * n, max_new_tokens=16, depth=4, metadata={}, seed=10_000)
    live = {}
    for spec in ("static:3", "entropy:1.5"):
        decoder = SpeculativeDecoder(target, far_draft, make_policy(spec), sampling, max_depth=4)
        live[spec] = [decoder.generate(prompt, 16, seed=seed).rounds for seed in range(n)]
    return traces, live


def _histograms(rounds_per_generation) -> tuple[Counter, Counter]:
    accepted, rounds = Counter(), Counter()
    for rounds_of_one in rounds_per_generation:
        accepted.update(r.accepted for r in rounds_of_one)
        rounds[len(rounds_of_one)] += 1
    return accepted, rounds


@pytest.mark.parametrize("spec", ["static:3", "entropy:1.5"])
def test_sampled_replay_matches_live_decoding_in_distribution(sampled_runs, spec):
    """Accepted tokens per round and rounds per generation: replay of sampled traces against live decoding,
    chi-squared at the 0.1 % level, for a fixed depth and a policy that reads the draft's features."""
    traces, live = sampled_runs
    replayed = run_policy(ReplayBackend(traces, flat_profile()), make_policy(spec), range(len(traces)))
    replay_accepted, replay_rounds = _histograms([e.cycles for e in replayed])
    live_accepted, live_rounds = _histograms(live[spec])
    for ours, theirs in ((replay_accepted, live_accepted), (replay_rounds, live_rounds)):
        statistic, df = chi2_two_samples(ours, theirs)
        assert statistic < CHI2_999[df], (statistic, df, ours, theirs)


def test_the_same_test_rejects_a_replay_with_the_ratio_the_wrong_way_round(sampled_runs, target, far_draft):
    """Accepting along the output with min(1, p(o)/q(o)) (the proposal's rule applied to the emitted token)
    is far from live decoding; the chi-squared test above says so."""
    traces, live = sampled_runs
    sampling, prompt, wrong = SamplingConfig(1.0), [9, 2, 2, 5, 11], []
    for i in range(len(traces)):
        output = traces.output(i).tolist()
        ids = torch.tensor([prompt + output])
        with torch.no_grad():
            p = sampling_distribution(target(ids).logits[0, len(prompt) - 1 : -1], sampling)
            q = sampling_distribution(far_draft(ids).logits[0, len(prompt) - 1 : -1], sampling)
        index = torch.tensor(output)[:, None]
        wrong.append(torch.clamp(p.gather(-1, index) / q.gather(-1, index), max=1.0)[:, 0].numpy())
    naive = dataclasses.replace(traces, accept_prob=np.concatenate(wrong).astype(np.float32))
    replayed = run_policy(ReplayBackend(naive, flat_profile()), make_policy("static:3"), range(len(naive)))
    statistic, df = chi2_two_samples(_histograms([e.cycles for e in replayed])[0], _histograms(live["static:3"])[0])
    assert statistic > CHI2_999[df]


def test_sampled_traces_of_the_old_format_are_refused(tmp_path, sampled_runs):
    traces = sampled_runs[0]
    arrays = {
        "match": traces.match.astype(np.int16),
        "features": traces.features.astype(np.float16),
        "accept_prob": np.tile(traces.accept_prob[:, None], (1, 4)).astype(np.float16),
    }
    write_npz(tmp_path / "old.npz", traces, arrays, "adaptive-draft/trace/1")
    with pytest.raises(ValueError, match="re-record"):
        TraceSet.load(tmp_path / "old.npz")


def test_static_depth_acceptance_replayed_from_traces_equals_live_decoding(target, near_draft):
    """benchmarks/trace_acceptance.py counts, from a trace, the accepted tokens, rejections, rounds and tokens that
    the live chain decoder at a static depth produces on the same prompt (greedy, fp64)."""
    from benchmarks.trace_acceptance import replay_static

    rows = [{"id": str(i), "lang": "en"} for i in range(len(PROMPTS))]
    traces = record(SpeculativeDecoder(target, near_draft, make_policy("static:1")), rows, PROMPTS, max_new_tokens=20, depth=4, metadata={})
    for depth in (1, 2, 4):
        for i, ids in enumerate(PROMPTS):
            result = SpeculativeDecoder(target, near_draft, make_policy(f"static:{depth}")).generate(ids, 20)
            live = (sum(r.accepted for r in result.rounds), sum(r.rejected for r in result.rounds), len(result.rounds), len(result.token_ids))
            assert replay_static(traces, i, depth) == live, (depth, i)


def test_the_pair_replay_benchmark_sets_each_policy_s_replay_beside_its_live_rows(target, near_draft):
    """benchmarks/pair_replay.py replays a pair benchmark's rows from the traces: live rows that are the replay's own
    records come back with the same τ, a live/replay round-time ratio of 1 and the same speedup both ways."""
    from benchmarks.pair_replay import compare
    from lab.evaluation import play

    rows = [{"id": f"p{i}", "lang": lang} for i, lang in enumerate(("en", "it", "en"))]
    traces = record(SpeculativeDecoder(target, near_draft, make_policy("static:1")), rows, PROMPTS, max_new_tokens=20, depth=4, metadata={})
    profile = flat_profile()
    plain = [{**row, "tokens": 20, "seconds": 20 * profile.target_step_seconds, "rounds": 20} for row in rows]
    report = {"plain": plain}
    for spec in ("static:1", "static:3"):
        records = play(ReplayBackend(traces, profile, 4), lambda spec=spec: make_policy(spec), range(len(rows)), traces.langs, 1e-4)
        report[spec] = [{**row, "tokens": r.tokens, "seconds": r.seconds, "rounds": r.rounds} for row, r in zip(rows, records)]
    lines = compare(report, traces, profile, ("en",), 4)
    assert lines[0].startswith("== en: 2 prompts")
    for line in lines[1:]:
        tau_live, tau_replay = (float(part.split()[-1]) for part in line.split("|")[0].split("replay"))
        speedups = [float(x.rstrip("x")) for x in line.split("speedup live ")[1].split(" replay ")]
        assert tau_live == tau_replay and "(live/replay 1.000)" in line and speedups[0] == pytest.approx(speedups[1], abs=1e-3), line
    with pytest.raises(ValueError, match="no trace"):
        compare({name: [{**r, "id": "elsewhere"} for r in rs] for name, rs in report.items()}, traces, profile, ("en",), 4)
    charged = report | {"confidence": report["static:3"]}  # a rule reading the draft's features pays per decision
    free, costly = (compare(charged, traces, profile, ("en",), 4, decision_seconds=cost) for cost in (0.0, 1e-3))

    def replay_speedup(line: str) -> float:
        return float(line.split(" replay ")[-1].rstrip("x"))

    assert free[1:3] == costly[1:3] == lines[1:3]  # the static depths: charged nothing either way
    assert replay_speedup(free[3]) > replay_speedup(costly[3])
