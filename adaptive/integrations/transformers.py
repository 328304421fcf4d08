"""A draft policy inside transformers' own ``generate()``, through its ``custom_generate`` hook.

::

    from adaptive import load_policy
    from adaptive.integrations.transformers import generate as adaptive_generate

    out = target.generate(**inputs, custom_generate=adaptive_generate, draft=assistant, policy=load_policy(RUN), max_new_tokens=128)

Why this route: a callable ``custom_generate`` is transformers 5's public way to replace the decoding loop —
``generate()`` still prepares the inputs, the generation config (the model's defaults merged with the
call's arguments), the logits processors and the stopping criteria, then hands them to :func:`generate`.
Its assisted decoding builds a ``CandidateGenerator`` from a fixed list inside a private method, so a
policy-driven candidate generator could only get in by overriding private methods.

The draft comes as ``draft=``, not ``assistant_model=``: with a callable ``custom_generate``, ``generate()``
passes on only the callable's own extra arguments, and ``assistant_model`` is one of its own (so is
``streamer``, which therefore receives the prompt only: stream with :meth:`SpeculativeDecoder.stream`). ``draft``
may be a standalone model sharing the target's vocabulary or an EAGLE-3 head
(:func:`adaptive.eagle3.load_head`).

The decoding is :class:`~adaptive.decoder.SpeculativeDecoder` (accept with min(1, p/q), residual on
rejection, bonus token; caches rolled back), under the sampling that the call's logits processors define:
temperature, top-k and top-p, applied identically to target and draft. Any other logits processor
(repetition penalty, min-length, bad words, ...) is refused with its name rather than silently dropped.
Stopping criteria (stop strings, time limits, the user's own) are checked after every emitted token with
``scores=None``; EOS and the length limit end drafting itself. Randomness comes from torch's global
generator, so ``torch.manual_seed`` makes a sampled call reproducible, as with plain ``generate()``.
Batch size 1 (as transformers' assisted decoding).
"""

from __future__ import annotations

import torch
from transformers import GenerationConfig, LogitsProcessorList, PreTrainedModel, StoppingCriteriaList
from transformers.generation import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper
from transformers.generation.utils import GenerateDecoderOnlyOutput

from adaptive.decoder import SpeculativeDecoder
from adaptive.drafts import Draft
from adaptive.policy import DraftPolicy
from adaptive.sampling import GREEDY, SamplingConfig
from adaptive.tree import TreeShape
from adaptive.tree_decoder import TreeDecoder
from adaptive.verification import CorrectionRule, residual_correction

SUPPORTED_PROCESSORS = ("TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper")
"""The logits processors whose sampling the decoder reproduces exactly on both models."""

_UNSUPPORTED_OUTPUTS = ("output_scores", "output_logits", "output_attentions", "output_hidden_states")


def sampling_from_processors(processors: LogitsProcessorList, do_sample: bool) -> SamplingConfig:
    """The :class:`SamplingConfig` that ``generate()``'s logits processors define (greedy when not sampling).

    Raises ValueError naming any processor outside :data:`SUPPORTED_PROCESSORS`, or a temperature / top-k /
    top-p warper out of their usual order (temperature, then top-k, then top-p)."""
    unsupported = [type(p).__name__ for p in processors if type(p).__name__ not in SUPPORTED_PROCESSORS]
    if unsupported:
        raise ValueError(
            f"logits processor(s) {', '.join(unsupported)} are not supported by the adaptive decoder; "
            f"supported: {', '.join(SUPPORTED_PROCESSORS)} (set the corresponding generation options off)"
        )
    if not do_sample:
        return GREEDY
    order = [SUPPORTED_PROCESSORS.index(type(p).__name__) for p in processors]
    if order != sorted(set(order)):
        raise ValueError(f"logits processors in the order {[type(p).__name__ for p in processors]}; expected temperature, top-k, top-p, each at most once")
    temperature, top_k, top_p = 1.0, None, 1.0
    for processor in processors:
        if isinstance(processor, TemperatureLogitsWarper):
            temperature = float(processor.temperature)
        elif isinstance(processor, TopKLogitsWarper):
            top_k = int(processor.top_k)
        elif isinstance(processor, TopPLogitsWarper):
            top_p = float(processor.top_p)
    return SamplingConfig(temperature, top_k, top_p)


def _check_call(input_ids: torch.Tensor, generation_config: GenerationConfig, draft, policy, model_kwargs: dict) -> None:
    if draft is None:
        raise ValueError(
            "pass the draft as draft=... (a model sharing the target's vocabulary, or an EAGLE-3 head); assistant_model= does not reach a custom_generate"
        )
    if input_ids.shape[0] != 1:
        raise ValueError(f"batch size 1 only (as transformers' assisted decoding), got input_ids of shape {tuple(input_ids.shape)}")
    mask = model_kwargs.get("attention_mask")
    if mask is not None and not bool((mask == 1).all()):
        raise ValueError("the attention mask holds padding; give the prompt without padding (batch size 1)")
    if generation_config.num_beams not in (None, 1):
        raise ValueError(f"num_beams={generation_config.num_beams}: speculative decoding here samples or decodes greedily, one beam")
    asked = [name for name in _UNSUPPORTED_OUTPUTS if getattr(generation_config, name, False)]
    if generation_config.return_dict_in_generate and asked:
        raise ValueError(f"{', '.join(asked)} are not returned by the adaptive decoder; return_dict_in_generate gives sequences only")


@torch.no_grad()
def generate(
    model: PreTrainedModel,
    input_ids: torch.LongTensor,
    logits_processor: LogitsProcessorList,
    stopping_criteria: StoppingCriteriaList,
    generation_config: GenerationConfig,
    draft: Draft | None = None,
    policy: DraftPolicy | None = None,
    max_depth: int = 16,
    correction: CorrectionRule = residual_correction,
    tree: TreeShape | str | None = None,
    **model_kwargs,
) -> torch.LongTensor | GenerateDecoderOnlyOutput:
    """The decoding loop ``generate()`` runs when given ``custom_generate=generate``: speculative decoding of
    ``model`` with ``draft``, ``policy`` choosing each round's depth and verification size.

    Args (besides what ``generate()`` prepares):
        draft: a standalone draft model sharing the target's vocabulary, or an EAGLE-3 head.
        policy: a :class:`~adaptive.policy.DraftPolicy`, e.g. ``adaptive.load_policy(RUN)`` or
            ``policies.make_policy("heuristic")``.
        max_depth: cap on drafted tokens per round (tree levels with ``tree``).
        correction: the rule at a rejection; keep the default except to audit (tests plug in the naive rule).
        tree: draft trees of this shape (a :class:`~adaptive.tree.TreeShape` or ``"K,W,V"``) instead of chains,
            greedy or sampled (:class:`~adaptive.tree_decoder.TreeDecoder`).

    Returns the prompt followed by the generated tokens, ``[1, length]`` (a ``GenerateDecoderOnlyOutput``
    holding only ``sequences`` when ``return_dict_in_generate``).
    """
    _check_call(input_ids, generation_config, draft, policy, model_kwargs)
    sampling = sampling_from_processors(logits_processor, bool(generation_config.do_sample))
    eos = generation_config._eos_token_tensor
    stops = {"max_depth": max_depth, "eos_token_id": [] if eos is None else eos.reshape(-1).tolist(), "correction": correction}
    if tree is None:
        decoder = SpeculativeDecoder(model, draft, policy, sampling, **stops)
    else:
        decoder = TreeDecoder(model, draft, policy, TreeShape.parse(tree) if isinstance(tree, str) else tree, sampling, **stops)
    budget = generation_config.max_length - input_ids.shape[1]
    sequence = input_ids
    if budget > 0:
        seed = None if sampling.is_greedy else int(torch.randint(2**62, (1,)))  # torch's global generator decides
        for stats in decoder.stream(input_ids, max_new_tokens=budget, seed=seed):
            stop = False
            for token in stats.tokens:
                sequence = torch.cat((sequence, torch.tensor([[token]], dtype=sequence.dtype, device=sequence.device)), dim=1)
                stop = bool(stopping_criteria(sequence, None).all())
                if stop:
                    break
            if stop:
                break
    if generation_config.return_dict_in_generate:
        return GenerateDecoderOnlyOutput(sequences=sequence)
    return sequence
