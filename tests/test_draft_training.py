"""Training drafts on the target's own responses, both kinds, on a tiny target: the draft vocabulary, the
standalone draft's loss, learning and resuming, the public layouts, and the feature cache."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from conftest import tiny_llama

from adaptive.decoder import SpeculativeDecoder, generate_plain
from adaptive.draft_model import build_draft, load_draft
from adaptive.eagle3 import load_head
from lab.distill import StandaloneKind, kl_loss
from lab.distill_eagle3 import Eagle3Kind, unrolled_loss
from lab.draft_training import (
    Batch,
    Sequence,
    TargetFeatures,
    TrainingConfig,
    _schedule,
    draft_log_probs,
    draft_vocabulary,
    heldout_accuracy,
    read_shards,
    train_draft,
)
from policies import make_policy


@pytest.fixture(scope="module")
def deep_target():
    return tiny_llama(seed=3, layers=6, dtype=torch.float32)


def _shards(folder, target, count: int = 24) -> None:
    folder.mkdir()
    generator = torch.Generator().manual_seed(0)
    rows = []
    for i in range(count):
        prompt = torch.randint(0, 16, (5,), generator=generator).tolist()
        with torch.no_grad():
            response = target.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False)[0, 5:].tolist()
        rows.append({"id": f"p{i}", "lang": ("it", "en")[i % 2], "task": "question", "prompt_ids": prompt, "response": response})
    (folder / "greedy-00000.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


class _Tokenizer:
    pad_token_id, eos_token_id, all_special_ids = 0, 0, [0]


def _config(**changes) -> TrainingConfig:
    return TrainingConfig(
        **{
            "draft_vocab_size": 10,
            "steps": 30,
            "batch_size": 4,
            "max_length": 32,
            "learning_rate": 3e-3,
            "warmup_steps": 2,
            "checkpoint_every": 15,
            "heldout_percent": 20,
            "heldout_sequences": 8,
            **changes,
        }
    )


def test_the_draft_vocabulary_keeps_the_required_then_the_most_frequent_tokens():
    rows = [Sequence("g:a", "en", [7, 7, 7, 8], [1, 1, 1, 2, 2, 3], "s", 0), Sequence("g:b", "en", [7], [1, 2, 4], "s", 1)]
    assert draft_vocabulary(rows, 2, always=[9]).tolist() == [1, 9]
    assert draft_vocabulary(rows, 4, always=[]).tolist() == [1, 2, 3, 4]
    assert draft_vocabulary(rows, 5, always=[]).tolist() == [1, 2, 3, 4, 7]  # then prompt tokens, which responses copy
    with pytest.raises(ValueError, match="only 6 distinct tokens"):
        draft_vocabulary(rows, 7, always=[])


def test_the_standalone_loss_is_zero_for_a_draft_equal_to_the_target(target):
    full = build_draft(target, target.config.num_hidden_layers, torch.arange(16)).double()
    tokens = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        final = target.model(input_ids=tokens).last_hidden_state
    batch = Batch(
        tokens,
        torch.ones_like(tokens),
        torch.tensor([[False, True, True, True, False]]),
        torch.zeros(1, 5, 96),
        draft_log_probs(final, target.get_output_embeddings().weight).double(),  # the teacher's dtype is the loss's
    )
    loss, predicted = kl_loss(full, batch, predict=True)
    assert loss.item() < 1e-9 and predicted.shape == tokens.shape


def test_the_heads_loss_is_the_soft_cross_entropy_of_every_unrolled_step(deep_target):
    """The loss (the output layer fused with logsumexp − p·z, gradients taken in the same pass) equals each
    step's soft cross-entropy computed directly, a log-softmax per drafted position, and so do its gradients;
    a prompt of one token leaves the first rows without a base for the later steps."""
    kind = Eagle3Kind(ttt_steps=4, decay=0.7)
    head = kind.build(deep_target, torch.arange(3, 13)).double()
    torch.manual_seed(2)
    tokens = torch.randint(0, 16, (3, 9))
    mask = torch.zeros(3, 9, dtype=torch.bool)
    mask[0, 0:8], mask[1, 3:6], mask[2, 5:8] = True, True, True
    aux = torch.randn(3, 9, 3 * head.config.hidden_size, dtype=torch.float64)
    target_log = torch.log_softmax(torch.randn(3, 9, 10, dtype=torch.float64), dim=-1)
    loss, predictions = unrolled_loss(head, tokens, aux, target_log, mask, 4, 0.7, predict=True)
    expected = 0.0
    for step, states in enumerate(head.unrolled(tokens, aux, 4)):
        terms, hits = [], 0
        for b, j in mask.nonzero().tolist():
            base = j - step - 1
            if base >= 0:
                logits = head.draft_logits(states[b, base])
                terms.append(-(target_log[b, j].exp() * torch.log_softmax(logits, dim=-1)).sum())
                hits += int(predictions[step][b, base] == logits.argmax())
        expected = expected + 0.7**step * torch.stack(terms).mean()
        assert hits == len(terms)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-12)
    fused = torch.autograd.grad(loss, list(head.parameters()), allow_unused=True)
    direct = torch.autograd.grad(expected, list(head.parameters()), allow_unused=True)
    for (name, _), a, b in zip(head.named_parameters(), fused, direct, strict=True):
        assert (a is None) == (b is None) and (a is None or torch.allclose(a, b, rtol=1e-9, atol=1e-12)), name
    assert unrolled_loss(head, tokens, aux, target_log, mask, 4, 0.7)[1] == []  # no arg-max unless asked


@pytest.mark.parametrize("kind", [Eagle3Kind(ttt_steps=3), StandaloneKind(num_layers=1)], ids=["eagle3", "standalone"])
def test_training_learns_resumes_and_writes_a_loadable_draft(deep_target, tmp_path, kind):
    _shards(tmp_path / "data", deep_target)
    extra = {"val": [s for s in read_shards(tmp_path / "data") if s.row < 4]}  # e.g. a workload split, measured beside
    train_draft(kind, deep_target, _Tokenizer(), tmp_path / "data", tmp_path / "out", _config(steps=15), also_measure=extra)  # stops at 15, as killed
    state = json.loads((tmp_path / "out" / "checkpoint" / "state.json").read_text())
    assert state["step"] == 15 and state["kind"] == kind.name
    measured = train_draft(kind, deep_target, _Tokenizer(), tmp_path / "data", tmp_path / "out", _config(), also_measure=extra)
    log = [json.loads(line) for line in (tmp_path / "out" / "log.jsonl").read_text().splitlines()]
    assert [entry["step"] for entry in log] == [0, 15, 30]  # the untrained draft, then each checkpoint
    assert all(len(entry["val"]["accuracy"]) == kind.steps_predicted for entry in log)
    assert "On the workload's val split" in (tmp_path / "out" / "README.md").read_text()
    assert log[-1]["heldout_loss"] < 0.9 * log[0]["heldout_loss"], [entry["heldout_loss"] for entry in log]
    assert len(measured["accuracy"]) == kind.steps_predicted and log[-1]["accuracy"][0] > log[0]["accuracy"][0]
    if kind.name == "eagle3":
        assert 1.0 <= measured["tau_depth4"] <= 4.0
        card = (tmp_path / "out" / "README.md").read_text()
        assert "EAGLE-3 draft head" in card and "| 30 |" in card and "Steps done: 30 of 30" in card
        draft = load_head(tmp_path / "out", deep_target)
        assert draft.config.draft_vocab_size == 10
    else:
        assert measured["tau_depth4"] is None
        draft = load_draft(tmp_path / "out", deep_target)
        assert len(draft.lm_head.token_ids) == 10
        assert deep_target.get_input_embeddings().weight.dtype == torch.float32  # training left the target's embedding alone
    prompt = [1, 5, 2, 9, 4]
    assert SpeculativeDecoder(deep_target, draft, make_policy("static:3")).generate(prompt, 20).token_ids == generate_plain(deep_target, prompt, 20).token_ids


@pytest.mark.parametrize("kind", [Eagle3Kind(ttt_steps=3), StandaloneKind(num_layers=1)], ids=["eagle3", "standalone"])
def test_a_run_continues_on_another_machine_from_its_committed_files_alone(deep_target, tmp_path, kind):
    """What a fresh clone holds of a run is ``out/`` without ``checkpoint/`` (git-ignored: the optimiser's
    moments are too big to commit): training continues from that draft and step, re-warming the rate."""
    _shards(tmp_path / "data", deep_target)
    train_draft(kind, deep_target, _Tokenizer(), tmp_path / "data", tmp_path / "out", _config(steps=15))
    shutil.copytree(tmp_path / "out", tmp_path / "clone", ignore=shutil.ignore_patterns("checkpoint"))
    saved = kind.load(tmp_path / "clone", deep_target).state_dict()
    measured = train_draft(kind, deep_target, _Tokenizer(), tmp_path / "data", tmp_path / "clone", _config())
    state = json.loads((tmp_path / "clone" / "state.json").read_text())
    assert state["step"] == 30 and state["fresh_optimiser_at"] == [15]
    log = [json.loads(line) for line in (tmp_path / "clone" / "log.jsonl").read_text().splitlines()]
    assert [entry["step"] for entry in log] == [0, 15, 30]
    assert log[-1]["heldout_loss"] < log[1]["heldout_loss"] and len(measured["accuracy"]) == kind.steps_predicted
    assert any(not torch.equal(value, kind.load(tmp_path / "clone", deep_target).state_dict()[name]) for name, value in saved.items())
    config = _config()
    assert _schedule(15, config, rewarm_from=15) == pytest.approx(_schedule(15, config) / config.warmup_steps)
    assert _schedule(17, config, rewarm_from=15) == _schedule(17, config)


@pytest.mark.parametrize("kind", [Eagle3Kind(ttt_steps=3), StandaloneKind(num_layers=1)], ids=["eagle3", "standalone"])
def test_training_from_the_feature_cache_equals_training_from_the_target(deep_target, tmp_path, kind):
    """The first run fills the cache; a second from scratch reads every batch from it and logs the same
    losses and held-out accuracies; a run without the cache does too."""
    _shards(tmp_path / "data", deep_target)
    config = _config(steps=12, checkpoint_every=6)
    logs = []
    for run, features in (("filling", tmp_path / "cache"), ("reading", tmp_path / "cache"), ("recomputing", None)):
        train_draft(kind, deep_target, _Tokenizer(), tmp_path / "data", tmp_path / run, config, features)
        logs.append([json.loads(line) for line in (tmp_path / run / "log.jsonl").read_text().splitlines()])
        if run == "filling":
            (folder,) = (tmp_path / "cache").iterdir()
            assert np.load(folder / "greedy-00000.jsonl.filled.npy").sum() >= 12 // 2  # 19 training rows, 12 batches of 4 seen
    for other in logs[1:]:
        for a, b in zip(logs[0], other, strict=True):
            assert a.get("loss", 0.0) == pytest.approx(b.get("loss", 0.0), rel=1e-6) and a["accuracy"] == b["accuracy"]


def test_a_read_only_cache_serves_what_another_training_filled_and_writes_nothing(deep_target, tmp_path):
    """Two trainings at once share one cache: the reader uses the rows the writer made durable, never writes,
    and trains exactly as it would recomputing every batch."""
    _shards(tmp_path / "data", deep_target)
    config = _config(steps=12, checkpoint_every=6)
    kind = StandaloneKind(num_layers=1)
    train_draft(kind, deep_target, _Tokenizer(), tmp_path / "data", tmp_path / "alone", config, tmp_path / "cache", write_features=False)
    assert not list((tmp_path / "cache").rglob("*.aux"))
    train_draft(Eagle3Kind(ttt_steps=3), deep_target, _Tokenizer(), tmp_path / "data", tmp_path / "writer", config, tmp_path / "cache")
    (folder,) = (tmp_path / "cache").iterdir()
    written = {path.name: path.read_bytes() for path in folder.iterdir()}
    train_draft(kind, deep_target, _Tokenizer(), tmp_path / "data", tmp_path / "reader", config, tmp_path / "cache", write_features=False)
    assert {path.name: path.read_bytes() for path in folder.iterdir()} == written
    alone, reader = ([json.loads(line) for line in (tmp_path / run / "log.jsonl").read_text().splitlines()] for run in ("alone", "reader"))
    for a, b in zip(alone, reader, strict=True):
        assert a.get("loss", 0.0) == pytest.approx(b.get("loss", 0.0), rel=1e-6) and a["accuracy"] == b["accuracy"]


def test_a_standalone_draft_equal_to_the_target_scores_full_held_out_accuracy(deep_target, tmp_path):
    """Each kind's predictions are judged against the target row they predict (a standalone draft's first
    step: the row it is made at); a draft that is the target agrees with it everywhere (bf16 autocast aside)."""
    _shards(tmp_path / "data", deep_target)
    kind = StandaloneKind()
    full = build_draft(deep_target, deep_target.config.num_hidden_layers, torch.arange(16))
    vocab = kind.vocabulary(full)
    measured = heldout_accuracy(kind, full, TargetFeatures(deep_target, None, vocab), read_shards(tmp_path / "data")[:8], _config(), vocab, 0)
    assert measured["accuracy"][0] > 0.95
