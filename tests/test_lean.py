"""The lean forward (adaptive/lean.py): transformers' logits, hidden states and tree attention reproduced; int4 and int8
weights that reproduce weights already on their grid; every single-sequence decoder on a lean target greedy-identical
to plain decoding of it, and exact under sampling (the naive rule detected by the same test)."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_head, tiny_llama
from test_decoder_exactness import HEAD_PROMPT, assert_exact_or_detected

from adaptive import SamplingConfig, SpeculativeDecoder, naive_correction, residual_correction
from adaptive.cached_model import CachedModel
from adaptive.copy_draft import CopyDraft
from adaptive.decoder import generate_plain
from adaptive.drafts import HeadSession
from adaptive.engines import resolve_engine, use_engine
from adaptive.lean import GROUP, LeanCache, LeanLinear, LeanLlama, make_lean, open_cache
from adaptive.lean_head import drafting_head
from adaptive.tree import TreeShape
from adaptive.tree_decoder import TreeDecoder
from policies import StaticDepth

PROMPT = [3, 7, 1, 12, 5, 9]


def ancestors_mask(length: int, parents: list[int]) -> torch.Tensor:
    """The additive mask ``[1, 1, n, length + n]`` of a tree after ``length`` context tokens: each node sees the
    context, its ancestors and itself (parent -1: the context)."""
    n = len(parents)
    mask = torch.full((1, 1, n, length + n), float("-inf"), dtype=torch.float64)
    mask[..., :length] = 0
    for node in range(n):
        seen = node
        while seen >= 0:
            mask[0, 0, node, length + seen] = 0
            seen = parents[seen]
    return mask


def test_the_lean_forward_gives_transformers_logits_hidden_states_and_tree_attention(target):
    """Prefill, single steps, a draft tree under its mask, keep and rollback: the lean session's logits and tapped
    hidden states (every layer, the final normed one included) equal transformers' (float64)."""
    taps = (0, 1, 2)
    lean, reference = LeanCache(target, LeanLlama(target, "model"), taps), CachedModel(target, taps=taps)
    for model in (lean, reference):
        model.prefill = model.forward(PROMPT)
    torch.testing.assert_close(lean.prefill, reference.prefill, rtol=0, atol=1e-10)
    for token in (4, 11):
        torch.testing.assert_close(lean.forward([token]), reference.forward([token]), rtol=0, atol=1e-10)
    parents = [-1, 0, 0, 1]
    length = lean.length
    mask = ancestors_mask(length, parents)
    positions = [length, length + 1, length + 1, length + 2]
    tree = [2, 6, 8, 10]
    torch.testing.assert_close(lean.forward_masked(tree, positions, mask), reference.forward_masked(tree, positions, mask), rtol=0, atol=1e-10)
    torch.testing.assert_close(lean.tapped, reference.tapped, rtol=0, atol=1e-10)
    path = [*range(length), length, length + 1, length + 3]  # the branch 2 -> 6 -> 10 accepted
    for model in (lean, reference):
        model.keep(path)
    torch.testing.assert_close(lean.forward([13]), reference.forward([13]), rtol=0, atol=1e-10)
    for model in (lean, reference):
        model.rollback(4)
    torch.testing.assert_close(lean.forward([0, 15]), reference.forward([0, 15]), rtol=0, atol=1e-10)
    torch.testing.assert_close(lean.tapped, reference.tapped, rtol=0, atol=1e-10)
    with pytest.raises(ValueError, match="cannot roll back to length 99"):
        lean.rollback(99)


def on_grid(model: torch.nn.Module) -> None:
    """Round ``model``'s matrices to the grids int4 (groups of 32, 16 levels from the group's minimum: Q4_1) and int8
    (one scale per row: the output head) hold exactly."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.dim() != 2 or "embed" in name:
                continue
            if name.startswith("lm_head"):
                scale = parameter.abs().amax(dim=1, keepdim=True) / 127
                parameter.copy_((parameter / scale).round() * scale)
                continue
            groups = parameter.reshape(parameter.shape[0], -1, GROUP)
            low, high = groups.amin(-1, keepdim=True), groups.amax(-1, keepdim=True)
            step = (high - low) / 15
            parameter.copy_((((groups - low) / step).round() * step + low).reshape(parameter.shape))


@pytest.mark.parametrize("weights", ["int8", "int4"])
def test_low_bit_weights_reproduce_a_model_whose_weights_lie_on_their_grid(weights):
    """A float32 model rounded to Q4_1's grid (int4) or to one scale per row (int8): the lean low-bit forward gives its
    logits up to float rounding; on the model's unrounded weights the difference is larger (the test can fail)."""
    model = tiny_llama(seed=3, vocab=64, hidden=64, dtype=torch.float32)
    if weights == "int8":
        with torch.no_grad():
            for parameter in model.parameters():
                if parameter.dim() == 2:
                    scale = parameter.abs().amax(dim=1, keepdim=True) / 127
                    parameter.copy_((parameter / scale).round() * scale)
    else:
        on_grid(model)
    lean, reference = LeanCache(model, LeanLlama(model, weights)), CachedModel(model)
    torch.testing.assert_close(lean.forward(PROMPT), reference.forward(PROMPT), rtol=0, atol=2e-4)
    torch.testing.assert_close(lean.forward([8]), reference.forward([8]), rtol=0, atol=2e-4)
    rough = tiny_llama(seed=3, vocab=64, hidden=64, dtype=torch.float32)
    difference = (LeanCache(rough, LeanLlama(rough, weights)).forward(PROMPT) - CachedModel(rough).forward(PROMPT)).abs().max()
    assert difference > 1e-2


def test_a_model_of_another_layout_and_bad_weights_are_refused(target):
    with pytest.raises(ValueError, match="weights must be one of model, int8, int4, int8-aten, int4-aten, got 'int3'"):
        LeanLlama(target, "int3")
    model = tiny_llama(seed=0)
    model.config.hidden_act = "gelu"
    with pytest.raises(ValueError, match="activation gelu.*--engine eager"):
        make_lean(model, "model")


@pytest.fixture(scope="module")
def lean_target():
    """The session's tiny target (same seed, same weights) with a lean engine attached."""
    return make_lean(tiny_llama(seed=0), "model")


@pytest.mark.parametrize("draft_name", ["near_draft", "eagle_head", "copy"])
def test_every_decoder_on_a_lean_target_is_greedy_identical_to_plain_decoding(lean_target, draft_name, request):
    """Chains (a model draft, made lean too; an EAGLE-3 head reading the lean target's hidden states; the copy
    drafter) and trees, on a lean target: the tokens of plain decoding of that target."""
    assert isinstance(open_cache(lean_target), LeanCache)
    draft = CopyDraft() if draft_name == "copy" else request.getfixturevalue(draft_name)
    if draft_name == "near_draft":
        draft = tiny_llama(seed=0)
        draft.load_state_dict(request.getfixturevalue("near_draft").state_dict())
        make_lean(draft, "model")
    plain = generate_plain(lean_target, PROMPT, max_new_tokens=40).token_ids
    chain = SpeculativeDecoder(lean_target, draft, StaticDepth(3))
    assert isinstance(chain.target, LeanCache)
    assert chain.generate(PROMPT, max_new_tokens=40).token_ids == plain
    if draft_name != "copy":
        tree = TreeDecoder(lean_target, draft, StaticDepth(3), TreeShape(2, 2, 6))
        assert tree.generate(PROMPT, max_new_tokens=40).token_ids == plain


@pytest.mark.slow
@pytest.mark.parametrize("correction", [residual_correction, naive_correction], ids=["residual", "naive"])
def test_a_lean_target_and_head_keep_the_target_distribution_and_naive_resampling_does_not(lean_target, eagle_head, correction):
    """T = 1, static:2, an EAGLE-3 head reading the lean target's states: the two-token distribution of the target
    (enumerated with transformers' forward) within 5σ with the residual rule; the naive rule is detected."""
    decoder = SpeculativeDecoder(lean_target, eagle_head, StaticDepth(2), SamplingConfig(1.0), correction=correction)
    assert isinstance(decoder.target, LeanCache)
    assert_exact_or_detected(decoder, lean_target, HEAD_PROMPT, correction)


def test_the_engine_switch_makes_llama_models_lean_and_back_and_names_a_bad_engine(eagle_head):
    """--engine's use_engine: a Llama-layout model gets the lean forward (a head keeps its own under 16/32-bit weights),
    eager takes it away, and an unknown engine is refused naming the allowed ones."""
    model = tiny_llama(seed=0)
    use_engine((model, eagle_head), "lean")
    assert isinstance(open_cache(model), LeanCache) and open_cache(model).engine.weights == "model"
    assert drafting_head(eagle_head) is eagle_head
    use_engine((model,), "lean-int8")
    assert open_cache(model).engine.weights == "int8"
    use_engine((model,), "eager")
    assert type(open_cache(model)) is CachedModel
    allowed = "eager, lean, lean-int8, lean-int4, lean-int4-aten, compiled, compiled-int8, compiled-int4, compiled-int4-aten"
    with pytest.raises(ValueError, match=f"engine must be auto or one of {allowed}, got 'fast'"):
        use_engine((model,), "fast")


def test_auto_picks_compiled_int4_for_a_llama_on_the_cpu_and_eager_where_int4_cannot_run(capsys):
    """The default engine: compiled-int4 for a Llama-layout model whose product inputs are multiples of 32 (this
    machine has a C++ compiler), eager with the reason for one whose are not; it says what it chose. A named engine
    is itself."""
    assert resolve_engine("auto", tiny_llama(seed=0, hidden=64)) == "compiled-int4"
    assert "engine auto: compiled-int4" in capsys.readouterr().err
    assert resolve_engine("auto", tiny_llama(seed=0, hidden=48)) == "eager"
    assert "int4 needs product input sizes that are multiples of 32, this model has [48, 96]" in capsys.readouterr().err
    assert resolve_engine("lean-int8", tiny_llama(seed=0, hidden=48)) == "lean-int8"
    model = tiny_llama(seed=0, hidden=48)
    assert use_engine((model,), "auto") == "eager" and type(open_cache(model)) is CachedModel


def test_a_profile_says_the_engine_it_was_measured_on(near_draft):
    """profile_pair on a lean target records ``engine: lean`` (eager: ``eager``), so a profile is never read as
    another engine's costs."""
    from adaptive.profiling import profile_pair

    model = make_lean(tiny_llama(seed=0), "model")
    assert profile_pair(model, near_draft, max_verify=2, contexts=(8,), reference_context=8, repetitions=1).document["engine"] == "lean"
    assert profile_pair(tiny_llama(seed=0), near_draft, max_verify=2, contexts=(8,), reference_context=8, repetitions=1).document["engine"] == "eager"


@pytest.mark.slow
def test_the_compiled_step_gives_transformers_logits_and_keeps_decoders_identical(eagle_head):
    """compiled engine (inductor, fused attention): logits and tapped hidden states of one token and of chains of 3 and 5
    (run padded to 4 and 8) equal transformers' (float64 model) before and after the cache grows and after a rollback,
    up to float32 rounding (RMSNorm runs in float32, as in transformers, and
    inductor's fused reduction sums in another order; a wrong attention or rotary is off by 1e-2 and more); a chain
    with an EAGLE-3 head on it emits plain decoding's tokens."""
    model = make_lean(tiny_llama(seed=0), "model", compiled=True)
    lean, reference = LeanCache(model, model.lean_engine, (0, 2)), CachedModel(model, taps=(0, 2))
    assert lean.engine.step is not None
    prompt = [(7 * i) % 16 for i in range(245)]
    for session in (lean, reference):
        session.forward(prompt)
    for tokens in ([4, 11, 3], [9, 12, 13, 15, 2], [6]):  # buckets 4 and 8, then one token: across the first block
        torch.testing.assert_close(lean.forward(tokens), reference.forward(tokens), rtol=0, atol=1e-5)
    for token in (4, 11, 3, 9, 12, 13, 15, 2):  # a token at a time, each in the grown cache
        torch.testing.assert_close(lean.forward([token]), reference.forward([token]), rtol=0, atol=1e-5)
    torch.testing.assert_close(lean.tapped, reference.tapped, rtol=0, atol=1e-5)
    for session in (lean, reference):
        session.rollback(100)
    torch.testing.assert_close(lean.forward([5]), reference.forward([5]), rtol=0, atol=1e-5)
    torch.testing.assert_close(lean.forward([5, 7]), reference.forward([5, 7]), rtol=0, atol=1e-5)
    torch.testing.assert_close(lean.tapped, reference.tapped, rtol=0, atol=1e-5)
    plain = generate_plain(model, PROMPT, max_new_tokens=30).token_ids
    assert SpeculativeDecoder(model, eagle_head, StaticDepth(3)).generate(PROMPT, max_new_tokens=30).token_ids == plain


@pytest.mark.slow
def test_two_compiled_engines_in_one_process_each_run_their_own_graph():
    """The compiled step skips guards on its engine's own weights and sizes: two engines of different sizes (and a
    third of the first's size with other weights) in one process each still give their own model's logits."""
    models = [make_lean(tiny_llama(seed=seed, hidden=hidden), "model", compiled=True) for seed, hidden in ((0, 32), (1, 64), (2, 32))]
    for model in models:
        lean, reference = LeanCache(model, model.lean_engine), CachedModel(model)
        for session in (lean, reference):
            session.forward([3, 1, 4, 1, 5])
        for token in (9, 2, 6):
            torch.testing.assert_close(lean.forward([token]), reference.forward([token]), rtol=0, atol=1e-5)


def test_a_low_bit_engine_drafts_with_an_int8_copy_of_the_head_and_leaves_the_head_whole():
    """Under a low-bit engine a head drafts with an int8 copy (every matrix a LeanLinear): its logits are the head's up
    to int8 rounding (and differ from them: the copy is used), many rows at once multiply the same int8 weights (densely)
    as a few at a time do, the head's own modules and saved weights are untouched,
    a chain drafting with it emits plain decoding's tokens, and eager takes the copy away."""
    target = tiny_llama(seed=0, hidden=64, dtype=torch.float32)
    head = tiny_head(target)
    saved = {name: tensor.clone() for name, tensor in head.state_dict().items()}
    use_engine((target, head), "lean-int4")
    lean = drafting_head(head)
    assert lean is not head and isinstance(lean.fc, LeanLinear) and isinstance(lean.midlayer.mlp.down_proj, LeanLinear)
    assert isinstance(head.fc, torch.nn.Linear) and head.state_dict().keys() == saved.keys()
    assert all(torch.equal(head.state_dict()[name], tensor) for name, tensor in saved.items())
    states = torch.randn(5, 64)
    exact, rounded = head.draft_logits(states), lean.draft_logits(states)
    torch.testing.assert_close(rounded, exact, rtol=0, atol=0.05 * exact.abs().max().item())
    assert not torch.equal(rounded, exact)
    many = torch.randn(40, 64)  # more than VERIFY_MAX rows (a prompt read at once): the dense twin of the same int8 weights
    pieces = torch.cat([lean.draft_logits(many[i : i + 8]) for i in range(0, 40, 8)])
    torch.testing.assert_close(lean.draft_logits(many), pieces, rtol=0, atol=1e-4 * pieces.abs().max().item())
    plain = generate_plain(target, PROMPT, max_new_tokens=30).token_ids
    decoder = SpeculativeDecoder(target, head, StaticDepth(3))
    assert decoder.draft.net is lean
    assert decoder.generate(PROMPT, max_new_tokens=30).token_ids == plain
    use_engine((target, head), "eager")
    assert drafting_head(head) is head


@pytest.mark.slow
def test_the_compiled_head_step_gives_the_heads_logits_across_cache_growth_and_rollback():
    """compiled engine: a head's compiled own-state step (float32, the head's own weights) gives the uncompiled head's
    logits up to float rounding, before and after its cache grows past its first block of 256 entries and after a
    rollback; a chain drafting with it emits plain decoding's tokens."""
    target = tiny_llama(seed=0, hidden=64, dtype=torch.float32)
    head = tiny_head(target)
    reference = tiny_head(target)
    use_engine((head,), "compiled")
    assert drafting_head(head).own_step is not None
    reading = CachedModel(target, taps=(0, 1, 2))
    prompt = [(7 * i) % 16 for i in range(250)]
    reading.forward(prompt)
    compiled, eager = HeadSession(head, reading), HeadSession(reference, reading)
    for session in (compiled, eager):
        session.forward(prompt)
    for token in (4, 11, 3, 9, 12, 13, 15, 2):  # own entries 250..257: across the first block
        torch.testing.assert_close(compiled.forward([token]), eager.forward([token]), rtol=0, atol=1e-5)
    reading.rollback(102)
    for session in (compiled, eager):
        session.rollback(100)
    torch.testing.assert_close(compiled.forward(prompt[100:102]), eager.forward(prompt[100:102]), rtol=0, atol=1e-5)  # from the target
    torch.testing.assert_close(compiled.forward([6, 1]), eager.forward([6, 1]), rtol=0, atol=1e-5)  # own entries again
    plain = generate_plain(target, PROMPT, max_new_tokens=30).token_ids
    assert SpeculativeDecoder(target, head, StaticDepth(3)).generate(PROMPT, max_new_tokens=30).token_ids == plain
    use_engine((head,), "eager")
