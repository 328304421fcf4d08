"""adaptive-draft: exact speculative decoding with draft policies that optimise wall-clock throughput.

Everything a user needs is importable from here::

    from adaptive import SpeculativeDecoder, SamplingConfig, make_policy
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from adaptive.costmodel import expected_tokens, expected_tokens_from_lengths, optimal_gamma, optimal_gamma_from_lengths, speedup
from adaptive.decoder import GenerationResult, SpeculativeDecoder, generate_plain
from adaptive.exactness import induced_distribution, monte_carlo_audit, total_variation
from adaptive.pair import ModelPair, check_compatible, load_pair, load_pair_from_paths
from adaptive.policy import BasePolicy, DraftPolicy, DraftState, DraftStep, RoundStats
from adaptive.sampling import GREEDY, SamplingConfig, sampling_distribution
from adaptive.verification import naive_correction, residual_correction, verify_block

if TYPE_CHECKING:
    from policies import make_policy
    from policies.learned import load_policy

__all__ = [
    "GREEDY",
    "BasePolicy",
    "DraftPolicy",
    "DraftState",
    "DraftStep",
    "GenerationResult",
    "ModelPair",
    "RoundStats",
    "SamplingConfig",
    "SpeculativeDecoder",
    "check_compatible",
    "expected_tokens",
    "expected_tokens_from_lengths",
    "generate_plain",
    "induced_distribution",
    "load_pair",
    "load_pair_from_paths",
    "load_policy",
    "make_policy",
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


def __getattr__(name: str) -> Any:
    """``make_policy`` and ``load_policy`` live in ``policies`` (which imports this package); resolve them
    on first use."""
    if name == "make_policy":
        from policies import make_policy

        return make_policy
    if name == "load_policy":
        from policies.learned import load_policy

        return load_policy
    raise AttributeError(f"module 'adaptive' has no attribute {name!r}")
