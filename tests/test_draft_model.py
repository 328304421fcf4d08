"""The project's draft format: subset head, shared embedding, save/load, and exact decoding with it."""

from __future__ import annotations

import pytest
import torch
from conftest import SUBSET, tiny_llama

from adaptive import SpeculativeDecoder, generate_plain
from adaptive.draft_model import load_draft, read_metadata, save_draft
from policies import StaticDepth


def test_subset_head_gives_minus_infinity_outside_the_subset(subset_draft):
    with torch.no_grad():
        logits = subset_draft(torch.tensor([[1, 4, 6]])).logits[0, -1]
    assert logits.shape == (16,)
    finite = torch.isfinite(logits).nonzero().flatten().tolist()
    assert finite == SUBSET


def test_draft_shares_the_target_embedding(target, subset_draft):
    assert subset_draft.get_input_embeddings().weight.data_ptr() == target.get_input_embeddings().weight.data_ptr()


def test_save_and_load_round_trip(tmp_path, target, subset_draft):
    save_draft(subset_draft, tmp_path, {"step": "7"})
    loaded = load_draft(tmp_path, target)
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    with torch.no_grad():
        before, after = subset_draft(ids).logits, loaded(ids).logits
    assert torch.equal(torch.isinf(before), torch.isinf(after))
    assert torch.allclose(before[torch.isfinite(before)], after[torch.isfinite(after)], atol=0.05)  # fp16 on disk
    assert read_metadata(tmp_path)["step"] == "7"
    assert not any("embed_tokens" in key for key in __import__("safetensors.torch").torch.load_file(tmp_path / "draft.safetensors"))


def test_loading_against_another_target_is_an_error(tmp_path, subset_draft):
    save_draft(subset_draft, tmp_path)
    with pytest.raises(ValueError, match="made for vocab 16"):
        load_draft(tmp_path, tiny_llama(0, vocab=32))
    with pytest.raises(ValueError, match="adaptive distill"):
        load_draft(tmp_path / "nowhere", tiny_llama(0))


def test_greedy_decoding_with_a_reduced_vocabulary_draft_is_identical_to_plain(target, subset_draft):
    decoder = SpeculativeDecoder(target, subset_draft, StaticDepth(3))
    for prompt in ([1], [4, 6, 9], [15, 12, 10, 6]):
        assert decoder.generate(prompt, 30).token_ids == generate_plain(target, prompt, 30).token_ids


def test_tokens_outside_the_subset_are_still_produced(target, subset_draft):
    plain = generate_plain(target, [4, 6, 9], 60).token_ids
    assert set(plain) - set(SUBSET), "the test needs a target output with tokens the draft cannot propose"
    result = SpeculativeDecoder(target, subset_draft, StaticDepth(3)).generate([4, 6, 9], 60)
    assert result.token_ids == plain
