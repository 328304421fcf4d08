"""adaptive-draft: exact speculative decoding with draft policies that optimise wall-clock throughput.

The library a user imports to decode (no gymnasium, no stable-baselines3)::

    from adaptive import load_pair, load_policy, SpeculativeDecoder

    pair = load_pair("smollm2-135m")
    decoder = SpeculativeDecoder(pair.target, pair.draft, load_policy("runs/quickstart-latest"), tokenizer=pair.tokenizer)

Baseline policies by spec string (``static:4``, ``heuristic``, ...) are ``policies.make_policy``.
"""

from __future__ import annotations

from adaptive.copy_draft import CopyDraft
from adaptive.costmodel import expected_tokens, expected_tokens_from_lengths, optimal_gamma, optimal_gamma_from_lengths, speedup
from adaptive.decoder import SpeculativeDecoder, generate_plain
from adaptive.engines import use_engine
from adaptive.exactness import induced_distribution, monte_carlo_audit, total_variation
from adaptive.generation import GenerationResult
from adaptive.lean import make_lean
from adaptive.learned_policy import LearnedPolicy, load_policy
from adaptive.pair import ModelPair, check_compatible, load_copy_pair, load_pair, load_pair_from_paths
from adaptive.policy import BasePolicy, DraftPolicy, DraftState, DraftStep, RoundStats
from adaptive.profile import CostProfile
from adaptive.sampling import GREEDY, SamplingConfig, sampling_distribution
from adaptive.tree import TreeShape
from adaptive.tree_decoder import TreeDecoder
from adaptive.verification import naive_correction, residual_correction, verify_block

__all__ = [
    "make_lean",
    "use_engine",
    "GREEDY",
    "BasePolicy",
    "CopyDraft",
    "CostProfile",
    "DraftPolicy",
    "DraftState",
    "DraftStep",
    "GenerationResult",
    "LearnedPolicy",
    "ModelPair",
    "RoundStats",
    "SamplingConfig",
    "SpeculativeDecoder",
    "TreeDecoder",
    "TreeShape",
    "check_compatible",
    "expected_tokens",
    "expected_tokens_from_lengths",
    "generate_plain",
    "induced_distribution",
    "load_copy_pair",
    "load_pair",
    "load_pair_from_paths",
    "load_policy",
    "monte_carlo_audit",
    "naive_correction",
    "optimal_gamma",
    "optimal_gamma_from_lengths",
    "residual_correction",
    "sampling_distribution",
    "speedup",
    "total_variation",
    "verify_block",
]
