"""Data generation for the draft: continuous-batched sampling on the lean engine, and the chat request pool."""

from __future__ import annotations

import os
import subprocess
import sys

import torch
from conftest import tiny_llama

from adaptive.lean import LeanLlama
from lab.background import live_measurement, measurements_running, yield_to_measurements
from lab.batched_sampling import continue_many, next_tokens
from lab.chat_prompts import NearDuplicates, expanded_requests
from lab.chat_seeds import MODIFIERS, REQUESTS

EOS = 3


def test_continuous_batches_continue_each_prompt_as_it_would_run_alone():
    """Greedy, rows of different lengths joining a batch smaller than the prompts: each continuation is what
    transformers' generate makes for that prompt alone (float32, stopping at the same end token)."""
    model = tiny_llama(seed=5, vocab=16, dtype=torch.float32)
    prompts = [[1, 2], [4, 5, 6, 7, 8, 9], [10], [11, 12, 13], [2, 2, 2, 2, 2, 2, 2, 2, 2]]
    got = {i: output for i, output, _ in continue_many(LeanLlama(model, "model"), prompts, max_new_tokens=12, eos=EOS, batch_size=2)}
    assert sorted(got) == list(range(len(prompts)))
    lengths = set()
    for i, prompt in enumerate(prompts):
        ids = torch.tensor([prompt])
        with torch.inference_mode():
            reference = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False, eos_token_id=EOS, pad_token_id=EOS)
        assert got[i] == reference[0, len(prompt) :].tolist()
        lengths.add(len(got[i]))
    assert len(lengths) > 1  # rows left the batch at different times


def test_top_k_samples_only_the_likeliest_tokens_with_their_renormalised_log_probability():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0, -1.0]]).repeat(4000, 1)
    chosen, log_prob = next_tokens(logits, temperature=1.0, top_k=2, generator=torch.Generator().manual_seed(0))
    assert set(chosen.tolist()) == {1, 3}
    expected = torch.log_softmax(torch.tensor([3.0, 2.0]), dim=0)
    assert torch.allclose(log_prob[chosen == 1], expected[0]) and torch.allclose(log_prob[chosen == 3], expected[1])
    share = (chosen == 1).float().mean().item()
    p = expected[0].exp().item()
    assert abs(share - p) < 5 * (p * (1 - p) / len(chosen)) ** 0.5


def test_near_duplicates_are_caught_and_different_requests_are_not():
    index = NearDuplicates()
    assert index.add_if_new("Write a short story about a dragon who is afraid of fire and lives in a cave.")
    assert not index.add_if_new("write a short story about a dragon who is afraid of fire and lives in a cave")
    assert index.add_if_new("Give me a recipe for a vegetable soup I can make in thirty minutes.")
    assert index.add_if_new("写一个关于小狐狸第一次看到大海的短故事。")
    assert not index.add_if_new("写一个关于小狐狸第一次看到大海的短故事")


def test_expanded_requests_cover_every_combination_except_those_near_a_held_out_prompt():
    held_out = "Write a short story about a robot that learns to cook. Keep it short."
    avoid = NearDuplicates()
    avoid.add_if_new(held_out)
    rows = expanded_requests(avoid)
    per_language = {lang: sum(len(t) * len(f) * len(MODIFIERS[lang]) for t, f in kinds.values()) for lang, kinds in REQUESTS.items()}
    for lang, count in per_language.items():
        if lang != "en":
            assert len([row for row in rows if row["lang"] == lang]) == count
    prompts = {row["prompt"] for row in rows}
    dropped = {
        template.replace("{x}", topic) + modifier
        for template in REQUESTS["en"]["story"][0]
        for topic in REQUESTS["en"]["story"][1]
        for modifier in MODIFIERS["en"]
    } - prompts
    assert held_out in dropped and all("robot that learns to cook" in text for text in dropped)
    assert len([row for row in rows if row["lang"] == "en"]) == per_language["en"] - len(dropped)
    assert len({row["id"] for row in rows}) == len(rows)
    assert not any("{x}" in row["prompt"] for row in rows)


def test_background_work_waits_while_a_live_measurement_of_another_process_runs(tmp_path, monkeypatch):
    """A marker of a running process holds background work back until it goes; a dead process's marker is
    removed at once; this process's own marker never holds itself back."""
    monkeypatch.setenv("ADAPTIVE_MEASURING_DIR", str(tmp_path))
    assert yield_to_measurements(sleep=lambda _: None, say=lambda _: None) == 0.0
    with live_measurement():
        assert (tmp_path / str(os.getpid())).exists() and not measurements_running()
    assert not (tmp_path / str(os.getpid())).exists()
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        marker = tmp_path / str(other.pid)
        marker.touch()
        polls = []

        def sleep(_: float) -> None:
            polls.append(1)
            if len(polls) == 3:  # the measurement ends
                marker.unlink()

        yield_to_measurements(sleep=sleep, say=lambda _: None)
        assert len(polls) == 3
    finally:
        other.kill()
        other.wait()
    stale = tmp_path / str(other.pid)
    stale.touch()
    assert not measurements_running() and not stale.exists()
