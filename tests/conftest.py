"""Shared fixtures: tiny randomly initialised Llama models built from a config (no download)."""

from __future__ import annotations

import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
# Live measurements wait while a pause file exists; the one a measurement beside the tests uses (runs/pause) must not
# hold the tests back.
os.environ["ADAPTIVE_PAUSE_FILE"] = os.path.join(tempfile.mkdtemp(prefix="adaptive-tests-"), "pause")

import pytest  # noqa: E402
import torch  # noqa: E402
from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast  # noqa: E402

torch.set_num_threads(1)


def tiny_llama(seed: int, vocab: int = 16, layers: int = 2, hidden: int = 32, dtype: torch.dtype = torch.float64) -> LlamaForCausalLM:
    """A tiny random Llama with no special tokens (so generation never stops early unless told to)."""
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(dtype).eval()
    # Larger output weights give peaked, model-like distributions instead of near-uniform ones.
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return model


def perturbed_copy(model: LlamaForCausalLM, scale: float, seed: int) -> LlamaForCausalLM:
    """A draft close to ``model``: the same weights plus Gaussian noise of relative size ``scale``."""
    clone = tiny_llama(0, model.config.vocab_size, model.config.num_hidden_layers, model.config.hidden_size, model.dtype)
    clone.load_state_dict(model.state_dict())
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in clone.parameters():
            noise = torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype)
            parameter.add_(scale * parameter.std() * noise)
    return clone


@pytest.fixture(scope="session")
def target() -> LlamaForCausalLM:
    return tiny_llama(seed=0)


@pytest.fixture(scope="session")
def near_draft(target) -> LlamaForCausalLM:
    return perturbed_copy(target, scale=0.3, seed=1)


@pytest.fixture(scope="session")
def far_draft() -> LlamaForCausalLM:
    return tiny_llama(seed=7, layers=1)


def flat_profile(c: float = 0.1):
    """A cost profile for tiny models: target step 10 ms, +1 ms per extra verified token, draft step 10·c ms,
    copy-drafter step 0.05 ms."""
    from adaptive.profile import CostProfile

    verify = tuple(10.0 + n for n in range(33))
    return CostProfile((1,), (10.0 * c,), (verify,), c, tuple(v / 10.0 for v in verify[1:]), 10.0, {}, copy_ms=(0.05,))


def brief_synthetic_config(name: str, eval_episodes: int = 4) -> dict:
    """An experiment config that trains a depth policy in seconds: 1,024 PPO steps on the synthetic env
    (α = 0.7, c = 0.1, depths up to 4), W&B off."""
    return {
        "name": name,
        "seed": 0,
        "env": {"backend": "synthetic", "max_depth": 4, "max_new_tokens": 128, "decision_seconds": 0.0, "alphas": [0.7], "c": 0.1},
        "depth_policy": {"timesteps": 1024, "n_steps": 512, "batch_size": 128, "n_epochs": 2},
        "eval_episodes": eval_episodes,
        "tracking": {"wandb": "disabled"},
    }


SUBSET = [0, 2, 3, 5, 7, 8, 11, 13, 14]
"""Tokens a reduced-vocabulary draft may propose; the other 7 of 16 have q = 0."""


@pytest.fixture(scope="session")
def subset_draft(target):
    """A reduced-vocabulary draft made like the shipped one: target layers, subset head, shared embedding."""
    from adaptive.draft_model import build_draft

    return build_draft(target, num_layers=1, token_ids=torch.tensor(SUBSET))


def tiny_head(target: LlamaForCausalLM):
    """A random EAGLE-3 head for a tiny target, in its dtype: its 2 layers' hidden states (0, 1, 2), 9 of 16 tokens."""
    from adaptive.eagle3 import Eagle3Config, Eagle3Head

    torch.manual_seed(11)
    head = Eagle3Head(Eagle3Config.for_target(target.config, len(SUBSET), layer_ids=(0, 1, 2)), target.get_input_embeddings())
    head = head.to(target.dtype).eval()
    head.set_vocabulary(torch.tensor(SUBSET))
    with torch.no_grad():
        head.lm_head.weight.mul_(8.0)  # peaked, model-like proposals
    return head


@pytest.fixture(scope="session")
def eagle_head(target):
    """A random EAGLE-3 head for the tiny target (:func:`tiny_head`)."""
    return tiny_head(target)


@pytest.fixture(scope="session")
def model_folders(tmp_path_factory):
    """A tiny target/draft pair with a real (word-level) tokenizer, saved like any local model, and an EAGLE-3 head."""
    from adaptive.eagle3 import Eagle3Config, Eagle3Head, save_head

    words = ["<eos>", "the", "cat", "sat", "on", "mat", "a", "dog", "ran", "far", "and", "then", "slept", "here", "now", "."]
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=_word_tokenizer(words), eos_token="<eos>", unk_token="<eos>")
    tokenizer.chat_template = "{% for message in messages %}{{ message['content'] }} {% endfor %}"
    target = tiny_llama(0, dtype=torch.float32)
    draft = perturbed_copy(target, 0.3, seed=1)
    folders = {}
    for name, model in (("target", target), ("draft", draft)):
        folder = tmp_path_factory.mktemp(name)
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        folders[name] = str(folder)
    torch.manual_seed(2)
    head = Eagle3Head(Eagle3Config.for_target(target.config, 9, layer_ids=(0, 1, 1)), target.get_input_embeddings())
    head.set_vocabulary(torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 15]))
    folders["head"] = str(tmp_path_factory.mktemp("head"))
    save_head(head, folders["head"])
    return folders


def _word_tokenizer(words: list[str]) -> Tokenizer:
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<eos>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return tokenizer
