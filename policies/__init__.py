"""Draft policies beside the decoding library: the baselines, the oracle (replay only), and
``make_policy(spec)``, which builds a baseline by name or loads a learned policy from a path
(``adaptive.load_policy``)."""

from policies.baselines import ConfidenceStop, CostModelPolicy, EntropyStop, HeuristicSchedule, StaticDepth, SuffixRule
from policies.registry import POLICY_SPECS, make_policy

__all__ = [
    "POLICY_SPECS",
    "ConfidenceStop",
    "CostModelPolicy",
    "EntropyStop",
    "HeuristicSchedule",
    "StaticDepth",
    "SuffixRule",
    "make_policy",
]
