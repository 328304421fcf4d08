"""Batched speculative decoding: the batched cache against one sequence at a time, greedy identity of every
request in a changing batch, and per-request exactness at T > 0 (enumeration, as in test_decoder_exactness)."""

from __future__ import annotations

import json
import random

import pytest
import torch
from conftest import tiny_head, tiny_llama
from test_decoder_exactness import deviation_statistics, exact_two_token_distribution

from adaptive.batch_decoder import BatchedSpeculativeDecoder
from adaptive.batch_profile import BatchCostProfile
from adaptive.batched_head import BatchedHeadSession
from adaptive.batched_model import BatchedCachedModel
from adaptive.cached_model import CachedModel
from adaptive.decoder import generate_plain
from adaptive.drafts import HeadSession, target_taps
from adaptive.engines import use_engine
from adaptive.lean import make_lean
from adaptive.policy import BatchDraftStep, BatchState, asks_each_step
from adaptive.profiling import profile_batches
from adaptive.sampling import SamplingConfig
from adaptive.verification import naive_correction, residual_correction
from policies.batch import BatchSizeSchedule, CappedBySchedule, CostModelBatch, FixedBatchDepth, GoodputRule, SpeculationOff, make_batch_policy

PROMPTS = [[1, 4, 6], [3], [2, 2, 9, 11, 5], [7, 8], [1, 4, 6, 6, 6, 6, 1], [5, 9], [12, 0, 3, 3]]


@pytest.fixture(params=["transformers", "lean"])
def batch_target(request, target):
    """The session's tiny target through transformers' forward, or the same weights with a lean engine attached."""
    return target if request.param == "transformers" else make_lean(tiny_llama(seed=0), "model")


def test_batched_cache_rows_equal_one_sequence_at_a_time(batch_target):
    """Rows joining, leaving, rolled back (holes), compacted: every row's logits equal a full forward of its
    own sequence alone (transformers'), on transformers' forward and on the lean one."""
    rng = random.Random(0)
    target = batch_target
    model, sequences, worst = BatchedCachedModel(target), [], 0.0
    assert (model.engine is None) == (not hasattr(target, "lean_engine"))

    def alone(sequence: list[int]) -> torch.Tensor:
        return target(input_ids=torch.tensor([sequence])).logits[0].detach()

    for _ in range(300):
        action = rng.random()
        if action < 0.1 or len(sequences) < 3:
            joining = [[rng.randrange(16) for _ in range(rng.randrange(0, 5))] for _ in range(rng.randrange(1, 3))]
            for logits, tokens in zip(model.add_rows(joining), joining):
                sequences.append(list(tokens))
                if tokens:
                    worst = max(worst, float((logits - alone(tokens)).abs().max()))
        elif action < 0.13:
            gone = rng.randrange(len(sequences))
            model.remove_rows([gone])
            sequences.pop(gone)
        elif action < 0.4:
            row = rng.randrange(len(sequences))
            keep = rng.randrange(len(sequences[row]) + 1)
            model.rollback(row, keep)
            sequences[row] = sequences[row][:keep]
        else:
            feeds = [[rng.randrange(16) for _ in range(rng.randrange(0, 4))] for _ in sequences]
            for logits, sequence, fed in zip(model.forward(feeds), sequences, feeds):
                sequence += fed
                if fed:
                    worst = max(worst, float((logits - alone(sequence)[-len(fed) :]).abs().max()))
        assert model.lengths == [len(s) for s in sequences]
    assert model.columns > max(model.lengths)  # holes were made (and compacted away at times)
    model.compact()
    assert model.columns == max(model.lengths)
    for logits, sequence in zip(model.forward([[1]] * len(sequences)), sequences):
        worst = max(worst, float((logits - alone(sequence + [1])[-1:]).abs().max()))
    assert worst < 1e-10


def test_batched_head_rows_equal_one_sequence_at_a_time(batch_target, eagle_head):
    """Rows joining, leaving, rolled back, drafting from their own states: every row's head logits equal
    those of a single-sequence head session fed the same tokens against the same target states (the batched
    target's taps on the lean forward too)."""
    rng = random.Random(1)
    target = batch_target
    taps = target_taps(eagle_head)
    batched_target = BatchedCachedModel(target, taps)
    batched = BatchedHeadSession(eagle_head, batched_target)
    alone: list[tuple[CachedModel, HeadSession]] = []

    def single(tokens: list[int]) -> tuple[CachedModel, HeadSession]:
        reading = CachedModel(target, taps=taps)
        session = HeadSession(eagle_head, reading)
        if tokens:
            reading.forward(tokens)
            session.forward(tokens)
        return reading, session

    worst, drafted_rows = 0.0, 0
    for _ in range(200):
        action = rng.random()
        if action < 0.1 or len(alone) < 3:
            joining = [[rng.randrange(16) for _ in range(rng.randrange(1, 6))] for _ in range(rng.randrange(1, 3))]
            batched_target.add_rows(joining)
            batched.add_rows(joining)
            alone += [single(tokens) for tokens in joining]
        elif action < 0.13:
            gone = rng.randrange(len(alone))
            batched_target.remove_rows([gone])
            batched.remove_rows([gone])
            alone.pop(gone)
        elif action < 0.35:  # verification: the target reads confirmed tokens, the head rolls back
            row = rng.randrange(len(alone))
            reading, session = alone[row]
            extra = [rng.randrange(16) for _ in range(rng.randrange(0, 3))]
            batched_target.forward([extra if b == row else [] for b in range(len(alone))])
            if extra:
                reading.forward(extra)
            keep = rng.randrange(min(session.length, reading.length) + 1)
            batched.rollback(row, keep)
            session.rollback(keep)
        else:  # every row feeds what its target has read, or drafts one token from its own state
            feeds = []
            for reading, session in alone:
                behind = max(0, reading.length - session.length)
                feeds.append([rng.randrange(16) for _ in range(behind or 1)])
            for logits, (_, session), fed in zip(batched.forward(feeds), alone, feeds):
                expected = session.forward(fed)
                finite = torch.isfinite(expected)
                assert torch.equal(finite, torch.isfinite(logits))
                worst = max(worst, float((logits[finite] - expected[finite]).abs().max()))
                drafted_rows += session.first_own is not None
        assert batched.lengths == [session.length for _, session in alone]
    assert worst < 1e-10 and drafted_rows > 50


@pytest.mark.parametrize("spec", ["plain", "static:1", "static:4", "schedule:1-2=5,3-3=2"])
@pytest.mark.parametrize("draft_name", ["near_draft", "far_draft", "eagle_head"])
def test_every_request_of_a_changing_batch_is_greedy_identical(spec, draft_name, target, request):
    """Seven prompts of different lengths, three at a time: requests join and leave between rounds, each
    output equals plain greedy decoding of that prompt alone (a head drafts nothing for a one-token prompt's
    first round)."""
    decoder = BatchedSpeculativeDecoder(target, request.getfixturevalue(draft_name), make_batch_policy(spec), max_depth=6, max_batch=3)
    results = decoder.generate(PROMPTS, max_new_tokens=30)
    for prompt, result in zip(PROMPTS, results):
        assert result.token_ids == generate_plain(target, prompt, 30).token_ids
        assert len(result.token_times) == len(result.token_ids) and result.first_token_latency >= 0
    accepted = sum(sum(r.accepted) for r in results)
    assert (accepted == 0) == (spec == "plain")
    assert decoder.idle and decoder.target.rows == decoder.draft.rows == 0


@pytest.mark.parametrize("engine", ["lean", "lean-int8"])
def test_a_changing_batch_on_a_lean_target_with_a_head_is_greedy_identical(engine):
    """The batched decoder on a lean target (its own weights in float64; int8 in float32, the head drafting from its
    int8 copy): every request's output equals plain greedy decoding of that prompt alone on the same engine."""
    target = tiny_llama(seed=0, dtype=torch.float64 if engine == "lean" else torch.float32)
    head = tiny_head(target)
    use_engine((target, head), engine)
    decoder = BatchedSpeculativeDecoder(target, head, make_batch_policy("static:4"), max_depth=6, max_batch=3)
    assert decoder.target.engine is target.lean_engine
    results = decoder.generate(PROMPTS, max_new_tokens=30)
    for prompt, result in zip(PROMPTS, results):
        assert result.token_ids == generate_plain(target, prompt, 30).token_ids
    assert sum(sum(r.accepted) for r in results) > 0


class StopWhenUnsure:
    """A stepped batch policy for tests: rounds up to ``bound`` tokens, stopped after a step where the most
    confident drafting request's top-1 probability fell below ``threshold``; it keeps what it was shown."""

    def __init__(self, bound: int, threshold: float) -> None:
        self.bound, self.threshold, self.name = bound, threshold, f"stop-below:{threshold}"
        self.shown: list[BatchDraftStep] = []

    def depth(self, state: BatchState) -> int:
        return min(self.bound, state.max_depth)

    def should_continue(self, state: BatchState, step: BatchDraftStep) -> bool:
        self.shown.append(step)
        return max(top1[-1] for top1 in step.top1 if top1) >= self.threshold


@pytest.mark.parametrize("draft_name, threshold", [("near_draft", 0.2), ("far_draft", 0.2), ("eagle_head", 0.9)])
def test_a_stepped_policy_stops_the_whole_batch_after_any_step_and_every_request_stays_greedy_identical(draft_name, threshold, target, request):
    """Asked after every draft step below its bound, with each request's top-1 probabilities so far: its
    "stop" verifies the batch there (rounds end both early and at the bound), and every request still equals
    plain greedy decoding of its prompt alone (thresholds: where each tiny draft's confidences split)."""
    policy = StopWhenUnsure(bound=5, threshold=threshold)
    decoder = BatchedSpeculativeDecoder(target, request.getfixturevalue(draft_name), policy, max_depth=6, max_batch=3)
    depths = []
    for prompt in PROMPTS:
        decoder.submit(prompt, 30)
    while not decoder.idle:
        round_ = decoder.step()
        depths.append(round_.depth)
        drafted = {len(top1) for step in policy.shown[-1:] for top1 in step.top1 if top1}
        assert round_.depth == 5 or drafted == {round_.depth}  # stopped right after the step it was shown
    results = [decoder.finished[i] for i in range(len(PROMPTS))]
    for prompt, result in zip(PROMPTS, results):
        assert result.token_ids == generate_plain(target, prompt, 30).token_ids
        assert all(d <= 5 for d in result.drafted)
    assert 5 in depths and any(0 < d < 5 for d in depths), depths
    for step in policy.shown:
        assert all(len(top1) in (0, step.drafted) and all(0.0 < p <= 1.0 for p in top1) for top1 in step.top1)


def test_wrappers_are_asked_after_each_draft_step_only_when_the_policy_inside_is_stepped(target, near_draft):
    """The schedule cap and the load switch pass a stepped policy's answers on, and are not asked at all
    around a policy that only picks depths (so the decoder computes no per-step probabilities for it)."""
    schedule = BatchSizeSchedule("1-8=4")
    for wrap in (lambda inner: CappedBySchedule(schedule, inner), lambda inner: SpeculationOff(8, inner)):
        stepped = StopWhenUnsure(bound=4, threshold=0.2)
        assert asks_each_step(wrap(stepped)) and not asks_each_step(wrap(FixedBatchDepth(4)))
        decoder = BatchedSpeculativeDecoder(target, near_draft, wrap(stepped), max_depth=6, max_batch=3)
        decoder.generate(PROMPTS, max_new_tokens=12)
        assert stepped.shown  # asked through the wrapper


N_SAMPLES = 20_000
EXACTNESS_PROMPTS = ([3], [5, 9])


@pytest.mark.parametrize(
    "correction, draft_name, stepped",
    [
        (residual_correction, "far_draft", False),
        (naive_correction, "far_draft", False),
        (residual_correction, "eagle_head", False),
        (residual_correction, "far_draft", True),
    ],
    ids=["residual", "naive", "residual-head", "residual-stepped"],
)
def test_each_request_of_a_batch_samples_the_target_distribution(target, correction, draft_name, stepped, request):
    """40,000 requests, two prompts taking turns in batches of 64, T = 1, top-k 12, static:2: each prompt's
    first two tokens follow the target's enumerated distribution within 5σ per outcome and on Pearson's
    statistic (tolerance derived from n as in test_decoder_exactness); the naive "resample from p" rule in
    the same decoder is detected. With an EAGLE-3 head too (the one-token prompt's second token is drafted
    from the target's state of the first), and with a stepped policy that stops the batch after its first
    step when the draft is unsure (the stop reads only the draft's own distributions)."""
    sampling = SamplingConfig(1.0, top_k=12)
    draft = request.getfixturevalue(draft_name)
    policy = StopWhenUnsure(bound=2, threshold=0.2) if stepped else FixedBatchDepth(2)
    decoder = BatchedSpeculativeDecoder(target, draft, policy, sampling, max_depth=2, max_batch=64, correction=correction)
    prompts = [p for _ in range(N_SAMPLES) for p in EXACTNESS_PROMPTS]
    results = decoder.generate(prompts, max_new_tokens=2, seeds=range(len(prompts)))
    if stepped:  # the stop was used: some requests drafted one token, others two
        assert {r.drafted[0] for r in results} == {1, 2}
    for k, prompt in enumerate(EXACTNESS_PROMPTS):
        counts = torch.zeros(16, 16, dtype=torch.float64)
        for result in results[k :: len(EXACTNESS_PROMPTS)]:
            first, second = result.token_ids
            counts[first, second] += 1
        max_z, chi2_z = deviation_statistics(counts, exact_two_token_distribution(target, prompt, sampling))
        if correction is residual_correction:
            assert max_z < 5.0 and chi2_z < 5.0, (prompt, max_z, chi2_z)
        else:
            assert max_z > 5.0 and chi2_z > 5.0, (prompt, "the naive rule should be detected as biased")


def test_a_request_samples_the_same_output_whatever_the_batch(target, far_draft):
    """Its own seed and generator: a request's sampled output does not depend on who shares its batch."""
    sampling = SamplingConfig(0.8)
    alone = BatchedSpeculativeDecoder(target, far_draft, FixedBatchDepth(3), sampling, max_batch=1).generate([[1, 4, 6]], 20, seeds=[5])
    crowd = BatchedSpeculativeDecoder(target, far_draft, FixedBatchDepth(3), sampling, max_batch=4).generate(PROMPTS[1:4] + [[1, 4, 6]], 20, seeds=[1, 2, 3, 5])
    assert alone[0].token_ids == crowd[-1].token_ids


def test_batch_policies_and_bad_settings_are_named(target, near_draft):
    schedule = BatchSizeSchedule("1-2=4,3-8=2,9-64=0")
    assert [schedule.depth(BatchState(b, 0, 8)) for b in (1, 2, 3, 8, 9, 64)] == [4, 4, 2, 2, 0, 0]
    with pytest.raises(ValueError, match="no depth for batch size 65"):
        schedule.depth(BatchState(65, 0, 8))
    assert FixedBatchDepth(6).depth(BatchState(1, 0, 4)) == 4
    capped = make_batch_policy("capped:1-2=4,3-8=2,9-64=0:static:3")
    assert [capped.depth(BatchState(b, 0, 8)) for b in (1, 2, 3, 8, 9)] == [3, 3, 2, 2, 0]
    assert capped.name == "capped:1-2=4,3-8=2,9-64=0:static:3"
    bad = (
        ("static:x", "unknown batch policy"),
        ("schedule:1-2", "LOW-HIGH=DEPTH"),
        ("schedule:3-1=2", "LOW <= HIGH"),
        ("capped:1-8=2", "unknown batch policy"),
        ("capped:1-8:static:2", "LOW-HIGH=DEPTH"),
    )
    for spec, message in bad:
        with pytest.raises(ValueError, match=message):
            make_batch_policy(spec)
    with pytest.raises(ValueError, match="standalone draft model .* or an EAGLE-3 head"):
        BatchedSpeculativeDecoder(target, object(), FixedBatchDepth(1))
    with pytest.raises(ValueError, match="max_batch"):
        BatchedSpeculativeDecoder(target, near_draft, FixedBatchDepth(1), max_batch=0)


def synthetic_profile(per_token_ms: dict[int, float], draft_ms: float = 2.0, depth: int = 6) -> BatchCostProfile:
    """A batched profile: a target forward costs 30 ms plus per_token_ms[B] per extra token per row."""
    sizes = sorted(per_token_ms)
    document = {
        "format": "adaptive-draft/batch-profile/1",
        "context": 128,
        "batch_sizes": sizes,
        "target": {str(b): {str(n): {"median_ms": 30.0 * (1 + b / 8) + per_token_ms[b] * (n - 1)} for n in range(1, depth + 2)} for b in sizes},
        "draft": {str(b): {"median_ms": draft_ms} for b in sizes},
    }
    return BatchCostProfile.from_dict(document)


def test_the_cost_model_drafts_less_as_verification_gets_dearer_with_the_batch():
    """Flat verification at batch 1, steep at batch 8: the cost model and the goodput rule draft deep alone
    and not at all in a full batch; the goodput rule weighs each request's own acceptance."""
    profile = synthetic_profile({1: 0.5, 8: 60.0})
    assert profile.target(4, 2) == pytest.approx((profile.target(1, 2) * 4 + profile.target(8, 2) * 3) / 7)
    assert profile.best_depth(1, 0.8) >= 4 and profile.best_depth(8, 0.8) == 0
    with pytest.raises(ValueError, match="outside the measured 1..8"):
        profile.target(9, 1)
    hits = ((4, 4, 4, 4),)

    def state(batch: int, accepted: tuple) -> BatchState:
        return BatchState(batch, 0, 6, accepted * batch, ((4, 4, 4, 4),) * batch)

    for policy in (CostModelBatch(profile), GoodputRule(profile)):
        assert policy.depth(state(1, hits)) >= 4 and policy.depth(state(8, hits)) == 0
        assert policy.depth(state(1, ((0, 0, 0, 0),))) < policy.depth(state(1, hits))
    dear = synthetic_profile({1: 20.0, 8: 60.0})  # a second token costs 60 % of a step alone: plain at the prior α 0.5
    assert dear.best_depth(1, 0.5) == 0 < dear.best_depth(1, 0.95)
    for policy in (CostModelBatch(dear), GoodputRule(dear)):
        assert policy.depth(BatchState(1, 0, 6)) == 1  # nothing known: one token drafted to measure α
        assert policy.depth(BatchState(1, 0, 6, ((0, 0, 0, 0),), ((0, 0, 0, 0),))) == 1  # only plain rounds lately: likewise
        assert policy.depth(BatchState(1, 0, 6, ((1, 1, 1, 1),), ((1, 1, 1, 1),))) >= 1  # every draft accepted
        assert policy.depth(BatchState(1, 0, 6, ((0, 0, 0, 0),), ((1, 1, 1, 1),))) == 0  # measured low: plain
        assert policy.depth(BatchState(1, 0, 0)) == 0
    off = make_batch_policy("off-above:2:static:4")
    assert [off.depth(BatchState(b, w, 8)) for b, w in ((1, 0), (2, 0), (2, 1), (8, 0))] == [4, 4, 0, 0]
    with pytest.raises(ValueError, match="needs a batched cost profile"):
        make_batch_policy("goodput")


@pytest.mark.parametrize("draft_name", ["near_draft", "eagle_head"])
def test_the_batched_profile_times_the_decoders_own_forwards(target, draft_name, request):
    document = profile_batches(target, request.getfixturevalue(draft_name), batch_sizes=(1, 3), max_tokens=3, context=16, repetitions=2)
    profile = BatchCostProfile.from_dict(document)
    assert profile.batch_sizes == (1, 3) and profile.max_depth == 2 and profile.rounds_ms is not None
    assert all(profile.target(b, n) > 0 for b in (1, 2, 3) for n in (1, 2, 3)) and profile.draft(2) > 0
    assert all(profile.round_ms(b, d) > 0 for b in (1, 3) for d in range(3))  # whole decoder rounds, timed
    assert profile.best_depth(2, 0.5) in range(3)


def test_the_load_test_checks_each_divergence_for_a_near_tie(target):
    """A forced divergence (another token than the target's arg-max) is counted and is not a near-tie."""
    from lab.loadtest import divergences

    prompt = [1, 4, 6]
    plain = generate_plain(target, prompt, 6).token_ids
    forced = plain[:3] + [(plain[3] + 1) % 16] + plain[4:]
    rows = lambda tokens: [{"rows": [{"prompt": 0, "token_ids": tokens}]}]  # noqa: E731
    found = divergences(target, [prompt], rows(forced), rows(plain))
    assert found["count"] == 1 and found["near_ties"] == 0 and found["each"][0]["position"] == 3
    assert divergences(target, [prompt], rows(plain), rows(plain))["count"] == 0


def test_a_load_test_waits_between_runs_while_the_pause_file_exists(target, near_draft, tmp_path, monkeypatch):
    """The pause file, made while a run is under way, holds the next run back until it is removed."""
    from adaptive.pair import ModelPair
    from lab import live_protocol
    from lab.loadtest import Load, LoadTestSettings, load_test

    pause = tmp_path / "pause"
    monkeypatch.setenv("ADAPTIVE_PAUSE_FILE", str(pause))
    log: list[str] = []

    def made(spec: str, pausing: bool = False):
        def make():
            log.append(spec)
            if pausing:
                pause.touch()  # other work starts while this run goes on
            return make_batch_policy(spec)

        return make

    def removing_sleep(seconds: float) -> None:
        log.append("waiting")
        if log.count("waiting") % 2 == 0:
            pause.unlink()

    real_wait = live_protocol.wait_while_paused

    def said(line: str) -> None:
        log.append(line.split()[0].rstrip(":"))

    monkeypatch.setattr(live_protocol, "wait_while_paused", lambda path: real_wait(path, sleep=removing_sleep, say=said))
    settings = LoadTestSettings((Load(2, concurrency=2),), max_new_tokens=4)
    policies = {"plain": made("plain", pausing=True), "static:2": made("static:2")}
    result = load_test(ModelPair(target, near_draft, None, "tiny"), policies, settings, SamplingConfig(), [("en", [1, 4, 6]), ("it", [9, 2])])
    assert log == ["plain", "paused", "waiting", "waiting", "resumed", "static:2"] and not pause.exists()
    assert set(result["loads"]["concurrency 2"]["runs"]) == {"plain", "static:2"}
    for entry in result["loads"]["concurrency 2"]["summary"].values():  # what the policy's decisions cost, measured
        assert entry["policy_us_per_round"] > 0 and 0 < entry["policy_share"] < 1
        assert entry["round_ms"].keys() == entry["depths"].keys()  # each round's cost, by batch size and depth
        assert all(entry["round_ms"][b].keys() == entry["depths"][b].keys() and min(entry["round_ms"][b].values()) > 0 for b in entry["depths"])
    for name, runs in result["loads"]["concurrency 2"]["runs"].items():  # accepted tokens per round add up to the requests'
        accepted = sum(row["accepted"] for run in runs for row in run["rows"])
        assert sum(r[5] for run in runs for r in run["rounds"]) == accepted and (accepted > 0) == (name != "plain")


def test_a_turn_clock_runs_only_in_its_turns():
    from lab.live_protocol import TurnClock

    now = [5.0]
    clock = TurnClock(lambda: now[0])
    assert clock() == 0.0
    with clock.turn():
        now[0] = 7.0
        assert clock() == 2.0
        with pytest.raises(RuntimeError, match="already running"), clock.turn():
            pass
    now[0] = 30.0  # another decoder's turn: not counted
    assert clock() == 2.0
    with clock.turn():
        now[0] = 30.5
    assert clock() == 2.5


@pytest.mark.parametrize("load", ["closed", "poisson"])
def test_interleaved_runs_decode_what_runs_one_after_another_decode_and_time_only_their_own_turns(target, near_draft, load):
    """Decoders taking rounds in turn (each on its own turn clock, in an order shuffled every lap) decode every request
    as when each runs alone, in the same rounds; their runs' seconds add up to no more than the whole interleaved run
    took."""
    import time

    from adaptive.generation import Clock
    from lab.live_protocol import TurnClock
    from lab.loadtest import Load, run_interleaved, run_load

    shape = Load(5, concurrency=2) if load == "closed" else Load(5, rate=400.0, max_batch=3)
    specs = ("plain", "static:2", "schedule:1-1=3,2-8=1")
    turns: list[str] = []

    class Logged:
        """The policy of ``spec``, noting each round it decides."""

        def __init__(self, spec: str) -> None:
            self.inner, self.name = make_batch_policy(spec), spec

        def depth(self, state: BatchState) -> int:
            turns.append(self.name)
            return self.inner.depth(state)

    def decoder(spec: str, clock=None) -> BatchedSpeculativeDecoder:
        return BatchedSpeculativeDecoder(target, near_draft, Logged(spec), max_depth=4, max_batch=shape.batch, clock=clock)

    alone = {spec: run_load(decoder(spec), PROMPTS[:5], shape, 8, seed=3) for spec in specs}
    clocks = {spec: TurnClock(Clock(target.device)) for spec in specs}
    turns.clear()
    start = time.perf_counter()
    together = run_interleaved({spec: decoder(spec, clocks[spec]) for spec in specs}, clocks, PROMPTS[:5], shape, 8, seed=3)
    elapsed = time.perf_counter() - start
    assert list(together) == list(specs)
    laps = [tuple(turns[i : i + len(specs)]) for i in range(0, 6 * len(specs), len(specs))]  # all three decode the first six laps
    assert all(sorted(lap) == sorted(specs) for lap in laps) and len(set(laps)) > 1  # each lap, each once, in changing order
    for spec in specs:
        (one, _, one_rounds), (other, _, other_rounds) = alone[spec], together[spec]
        assert [r.token_ids for r in one] == [r.token_ids for r in other] and all(r.token_ids for r in one)
        if load == "closed":  # Poisson arrivals land on other rounds when the rounds take other times
            assert [(r[0], r[1], r[5]) for r in one_rounds] == [(r[0], r[1], r[5]) for r in other_rounds]
    walls = [wall for _, wall, _ in together.values()]
    assert min(walls) > 0 and sum(walls) <= elapsed


def test_every_policy_of_a_load_test_is_warmed_up_before_any_timed_run(target, near_draft):
    """The warm-up builds and runs each policy (not only one), so the first policy measured carries no first-use
    cost; each one decodes tokens in it."""
    from adaptive.pair import ModelPair
    from lab.loadtest import warm_up

    rounds: dict[str, int] = {}

    def counted(spec: str):
        def make():
            policy = make_batch_policy(spec)
            decide = policy.depth

            def counting(*args, **kwargs):
                rounds[spec] = rounds.get(spec, 0) + 1
                return decide(*args, **kwargs)

            policy.depth = counting
            return policy

        return make

    policies = {spec: counted(spec) for spec in ("plain", "static:2", "static:3")}
    warm_up(ModelPair(target, near_draft, None, "tiny"), policies, SamplingConfig(), [[1, 4, 6], [9, 2]], max_depth=4)
    assert set(rounds) == set(policies) and min(rounds.values()) > 0


def test_a_killed_load_test_resumes_at_the_first_unfinished_load(target, near_draft, tmp_path):
    """Each finished load is kept in the checkpoint; a rerun measures only the loads that are missing (one cut short
    by a kill included) and gives the finished ones back as measured; another identity is refused."""
    from adaptive.pair import ModelPair
    from lab.loadtest import Load, LoadTestSettings, load_test

    made: list[str] = []

    def factory(spec: str):
        return lambda: made.append(spec) or make_batch_policy(spec)

    pair, policies = ModelPair(target, near_draft, None, "tiny"), {"plain": factory("plain"), "static:2": factory("static:2")}
    settings = LoadTestSettings((Load(3, concurrency=1), Load(3, concurrency=2)), max_new_tokens=6)
    prompts = [("en", [1, 4, 6]), ("it", [9, 2, 2, 5]), ("zh", [3, 7])]
    checkpoint, greedy = tmp_path / "live-load.partial.jsonl", SamplingConfig()
    first = load_test(pair, policies, settings, greedy, prompts, checkpoint, {"draft": "a"})
    lines = checkpoint.read_text().splitlines()
    assert len(made) == 4 and len(lines) == 3  # header, then one line per load
    checkpoint.write_text("\n".join([*lines[:2], lines[2][:40]]))  # killed while writing the second load
    again = load_test(pair, policies, settings, greedy, prompts, checkpoint, {"draft": "a"})
    assert len(made) == 6 and list(again["loads"]) == ["concurrency 1", "concurrency 2"]
    assert again["loads"]["concurrency 1"] == json.loads(json.dumps(first["loads"]["concurrency 1"]))  # read back, not re-measured
    with pytest.raises(ValueError, match="other identity"):
        load_test(pair, policies, settings, greedy, prompts, checkpoint, {"draft": "b"})
    assert len(made) == 6


def test_pooled_load_tests_add_their_runs_and_pair_requests_within_each_file(target, near_draft):
    """benchmarks/pool_loadtests.py pools two load tests of the same requests: runs add up per load, a policy only one
    file ran is paired within that file, and files with other settings are refused."""
    from adaptive.pair import ModelPair
    from benchmarks.pool_loadtests import compare, pool
    from lab.loadtest import Load, LoadTestSettings, load_test

    pair, prompts = ModelPair(target, near_draft, None, "tiny"), [("en", [1, 4, 6]), ("it", [9, 2, 2, 5])]
    policies = {name: (lambda name=name: make_batch_policy(name)) for name in ("plain", "static:2", "static:3")}
    first = load_test(pair, policies, LoadTestSettings((Load(2, concurrency=1), Load(2, concurrency=2)), max_new_tokens=6), SamplingConfig(), prompts)
    fewer = {name: policies[name] for name in ("plain", "static:2")}
    more = load_test(pair, fewer, LoadTestSettings((Load(2, concurrency=2),), max_new_tokens=6, repeats=2), SamplingConfig(), prompts)
    pooled = pool([json.loads(json.dumps(first)), json.loads(json.dumps(more))])
    assert {name: len(runs) for name, runs in pooled["concurrency 2"].items()} == {"plain": 2, "static:2": 2, "static:3": 1}
    lines = compare(pooled, "plain", 100.0)
    at_two = lines[lines.index("## concurrency 2") + 1 :]
    assert at_two[0].startswith("plain: 3 runs") and at_two[1].startswith("static:2: 3 runs") and at_two[2].startswith("static:3: 1 runs")
    assert all("per request / plain" in line for line in at_two[1:])
    other = json.loads(json.dumps(more))
    other["settings"]["max_new_tokens"] = 7
    with pytest.raises(ValueError, match="max_new_tokens"):
        pool([first, other])
