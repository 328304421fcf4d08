"""Draft policies: the baselines, and (later) learned ones. ``make_policy("static:4")`` builds one by name."""

from policies.baselines import ConfidenceStop, CostModelPolicy, EntropyStop, HeuristicSchedule, StaticDepth
from policies.registry import POLICY_SPECS, make_policy

__all__ = [
    "POLICY_SPECS",
    "ConfidenceStop",
    "CostModelPolicy",
    "EntropyStop",
    "HeuristicSchedule",
    "StaticDepth",
    "make_policy",
]
