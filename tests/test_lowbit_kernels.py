"""The AVX512-BF16 low-bit kernels (adaptive/lowbit_kernels.py): products equal to the weights they pack, each row
computed alone (verification and plain decoding agree bit for bit), sizes that do not pack refused; a bf16 int4 target
on them, its compiled verification and batched forward equal to the uncompiled ones, every decoder greedy-identical to
plain decoding."""

from __future__ import annotations

import random

import pytest
import torch
from conftest import tiny_llama

from adaptive import SpeculativeDecoder
from adaptive.batch_decoder import BatchedSpeculativeDecoder
from adaptive.batched_model import BatchedCachedModel
from adaptive.decoder import generate_plain
from adaptive.lean import GROUP, LeanCache, Product, make_lean
from adaptive.lowbit_kernels import available, obstacle, pack_int4
from adaptive.tree import TreeShape
from adaptive.tree_decoder import TreeDecoder
from policies import StaticDepth
from policies.batch import make_batch_policy

pytestmark = pytest.mark.skipif(obstacle() is not None or not available(), reason=f"the low-bit kernels do not run here: {obstacle()}")

PROMPT = [3, 7, 1, 12, 5, 9, 14, 2, 8, 6, 11, 4]


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_the_kernels_multiply_by_the_weights_they_pack_each_row_alone(kind):
    """bf16 activations of 1 to 17 rows (blocks of 8 and a remainder): within bf16 rounding of the float64 product
    with the same weights (int4: the grid's levels, steps and offsets; int8: levels and row scales), and each row equal
    bit for bit to that row multiplied alone. The dense twin for many rows holds each of those weights rounded to bf16
    and multiplies 40 rows as closely."""
    torch.manual_seed(0)
    weight = torch.randn(96, 4 * GROUP) * 0.05
    product = Product(weight, kind, torch.bfloat16)
    assert product.kernel == f"{kind}-dot"
    if kind == "int8":
        levels, scale = Product(weight, "int8-aten", torch.bfloat16).tensors  # torch's kernel's operands: the same weights
        exact = levels.double() * scale.double()[:, None]
    else:
        groups = weight.reshape(96, 4, GROUP)
        low, high = groups.amin(-1, keepdim=True), groups.amax(-1, keepdim=True)
        step = ((high - low) / 15).to(torch.bfloat16).double()
        offset = (low + 8 * (high - low) / 15).to(torch.bfloat16).double()
        levels = ((groups - low) / ((high - low) / 15)).round().clamp(0, 15)
        exact = ((levels - 8) * step + offset).reshape(96, -1)
    for rows in (1, 5, 8, 9, 17):
        x = torch.randn(rows, 4 * GROUP).bfloat16()
        out = product(x)
        reference = x.double() @ exact.T
        torch.testing.assert_close(out.double(), reference, rtol=0, atol=2**-7 * reference.abs().max().item())
        assert torch.equal(torch.cat([product(x[i : i + 1]) for i in range(rows)]), out)
    wide = Product(weight, kind, torch.bfloat16, wide=True).wide  # for many rows: one dense product of the same weights
    assert wide.kernel == "model" and bool(((wide.tensors[0].double() - exact).abs() <= 2**-8 * exact.abs() + 1e-30).all())
    x = torch.randn(40, 4 * GROUP).bfloat16()
    reference = x.double() @ exact.T
    torch.testing.assert_close(wide(x).double(), reference, rtol=0, atol=2**-7 * reference.abs().max().item())


def test_sizes_that_do_not_pack_are_refused_naming_them():
    """Outputs must come in tiles of 16 and inputs in groups of 32; an int8 product of another size keeps torch's kernel."""
    with pytest.raises(ValueError, match="outputs in multiples of 16 and inputs in multiples of 32, got 24 x 64"):
        pack_int4(torch.zeros(24, 64, dtype=torch.int32), torch.ones(24, 2), torch.zeros(24, 2))
    assert Product(torch.randn(24, 64), "int8", torch.bfloat16).kernel == "int8"


@pytest.fixture(scope="module")
def compiled_target():
    """A bf16 tiny Llama on compiled-int4 (step and verification compiled at once)."""
    return make_lean(tiny_llama(seed=0, hidden=64, dtype=torch.bfloat16), "int4", compiled=True)


@pytest.mark.slow
def test_a_bf16_int4_target_on_the_kernels_verifies_compiled_as_uncompiled_and_decodes_as_plain(compiled_target):
    """compiled-int4 on a bf16 Llama: its products run on the kernels (the output head's int8 too); verifications of
    2 to 9 tokens through the compiled graph give the uncompiled forward's logits up to bf16 rounding (a wrong mask or
    rotary is off by far more); chains and trees emit plain decoding's tokens."""
    target = compiled_target
    twin = make_lean(tiny_llama(seed=0, hidden=64, dtype=torch.bfloat16), "int4")
    engine = target.lean_engine
    assert {engine.qkv[0].kernel, engine.down[0].kernel, engine.head.kernel} == {"int4-dot", "int8-dot"}
    compiled, uncompiled = LeanCache(target, engine), LeanCache(twin, twin.lean_engine)
    for session in (compiled, uncompiled):
        session.forward(PROMPT)
    for tokens in ([4, 11], [9, 12, 13, 15, 2], [6, 1, 0, 3, 7, 10, 5, 8, 13]):
        expected = uncompiled.forward(tokens).float()
        torch.testing.assert_close(compiled.forward(tokens).float(), expected, rtol=0, atol=0.02 * expected.abs().max().item())
    draft = make_lean(tiny_llama(seed=0, hidden=64, dtype=torch.bfloat16), "int4")
    plain = generate_plain(target, PROMPT, max_new_tokens=40).token_ids
    assert SpeculativeDecoder(target, draft, StaticDepth(4)).generate(PROMPT, max_new_tokens=40).token_ids == plain
    assert TreeDecoder(target, draft, StaticDepth(3), TreeShape(2, 2, 6)).generate(PROMPT, max_new_tokens=40).token_ids == plain


@pytest.mark.slow
def test_a_long_prompt_is_multiplied_densely_as_the_kernels_would_and_decoding_after_it_stays_identical(compiled_target):
    """A forward of more than VERIFY_MAX tokens (a prompt's prefill) multiplies dense bf16 copies of the weights the
    kernels read: its logits, and the next step on its cache, are those of the same prompt fed in pieces through the
    kernels up to bf16 rounding (wrong weights or positions are off by far more); chains after such a prefill emit
    plain decoding's tokens."""
    prompt = [(5 * i + 3) % 16 for i in range(40)]
    twin = make_lean(tiny_llama(seed=0, hidden=64, dtype=torch.bfloat16), "int4")
    assert twin.lean_engine.qkv[0].wide.kernel == "model" and twin.lean_engine.qkv[0].kernel == "int4-dot"
    whole, pieces = LeanCache(twin, twin.lean_engine), LeanCache(twin, twin.lean_engine)
    dense = whole.forward(prompt).float()
    kernels = torch.cat([pieces.forward(prompt[i : i + 8]) for i in range(0, len(prompt), 8)]).float()
    torch.testing.assert_close(dense, kernels, rtol=0, atol=0.02 * kernels.abs().max().item())
    after = pieces.forward([4]).float()
    torch.testing.assert_close(whole.forward([4]).float(), after, rtol=0, atol=0.02 * after.abs().max().item())
    draft = make_lean(tiny_llama(seed=0, hidden=64, dtype=torch.bfloat16), "int4")
    plain = generate_plain(compiled_target, prompt, max_new_tokens=30).token_ids
    assert SpeculativeDecoder(compiled_target, draft, StaticDepth(4)).generate(prompt, max_new_tokens=30).token_ids == plain


@pytest.mark.slow
def test_the_compiled_batched_forward_runs_every_batch_on_one_graph_as_the_uncompiled_one(compiled_target):
    """The batched cache on compiled-int4 against the same weights uncompiled, through rows joining, leaving and rolled
    back, 1 to 5 rows of 0 to 5 tokens (one row of one token included): the same logits up to bf16 rounding, with no
    compile after the first (dynamo is told to fail on one); the batched decoder emits plain decoding's tokens."""
    twin = make_lean(tiny_llama(seed=0, hidden=64, dtype=torch.bfloat16), "int4")
    compiled, uncompiled = BatchedCachedModel(compiled_target), BatchedCachedModel(twin)
    assert compiled_target.lean_engine.batch_compiled and not twin.lean_engine.batch_compiled
    rng, shapes = random.Random(0), set()
    with torch._dynamo.config.patch(error_on_recompile=True):
        for model in (compiled, uncompiled):
            model.add_rows([PROMPT[:5], PROMPT[3:]])
        for _ in range(40):
            action = rng.random()
            if action < 0.1 and compiled.rows < 5:
                joining = [PROMPT[: rng.randrange(1, 8)]]
                for model in (compiled, uncompiled):
                    model.add_rows(joining)
            elif action < 0.2 and compiled.rows > 1:
                gone = rng.randrange(compiled.rows)
                for model in (compiled, uncompiled):
                    model.remove_rows([gone])
            elif action < 0.35:
                row = rng.randrange(compiled.rows)
                length = rng.randrange(1, compiled.lengths[row] + 1)
                for model in (compiled, uncompiled):
                    model.rollback(row, length)
            feeds = [[rng.randrange(16) for _ in range(rng.choice([0, 1, 1, 2, 5]))] for _ in range(compiled.rows)]
            if compiled.rows == 1 and rng.random() < 0.5:
                feeds = [[rng.randrange(16)]]
            shapes.add((compiled.rows, max(map(len, feeds))))
            for mine, theirs in zip(compiled.forward(feeds), uncompiled.forward(feeds)):
                if mine.numel():
                    expected = theirs.float()
                    torch.testing.assert_close(mine.float(), expected, rtol=0, atol=0.03 * expected.abs().max().item())
    assert (1, 1) in shapes and len(shapes) >= 6
    prompts = [PROMPT, PROMPT[:4], PROMPT[5:], [9, 1]]
    draft = make_lean(tiny_llama(seed=0, hidden=64, dtype=torch.bfloat16), "int4")
    results = BatchedSpeculativeDecoder(compiled_target, draft, make_batch_policy("static:4"), max_depth=6, max_batch=3).generate(prompts, 30)
    for prompt, result in zip(prompts, results):
        assert result.token_ids == generate_plain(compiled_target, prompt, 30).token_ids


def test_the_build_reads_one_copy_of_the_source_per_machine_rewritten_only_when_it_changes(tmp_path):
    """torch rebuilds an extension whose source path changed: every checkout builds from one copy in the cache."""
    from adaptive.lowbit_kernels import SOURCE, stable_source

    copy = stable_source(tmp_path)
    assert copy.read_bytes() == SOURCE.read_bytes() and copy.parent == tmp_path
    stamp = copy.stat().st_mtime_ns
    assert stable_source(tmp_path) == copy and copy.stat().st_mtime_ns == stamp  # unchanged text: untouched
    copy.write_text("// an older version")
    assert stable_source(tmp_path).read_bytes() == SOURCE.read_bytes() and sorted(p.name for p in tmp_path.iterdir()) == [SOURCE.name]
