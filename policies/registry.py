"""Policies by spec string, e.g. ``static:4``, ``heuristic``, ``confidence:0.4``, ``entropy:2.0``, ``specdec:0.7``, ``suffix``, ``costmodel``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from adaptive.learned_policy import load_policy
from adaptive.policy import DraftPolicy
from policies.acceptance import SpecDecStop
from policies.baselines import ConfidenceStop, CostModelPolicy, EntropyStop, HeuristicSchedule, StaticDepth, SuffixRule

POLICY_SPECS: dict[str, tuple[Callable[[str | None], DraftPolicy], str]] = {
    "static": (
        lambda arg: StaticDepth(_required_int(arg.partition(":")[0] if arg else arg, "static"), (arg or "").partition(":")[2] or "model"),
        "static:G[:SOURCE] — always draft G tokens (SOURCE, beside a copy drafter: model, copy or copy+model)",
    ),
    "heuristic": (
        lambda arg: HeuristicSchedule(int(arg) if arg else 5),
        "heuristic[:G0] — transformers' +2/-1 schedule starting at G0 (default 5)",
    ),
    "confidence": (
        lambda arg: ConfidenceStop(float(arg) if arg else 0.4),
        "confidence[:TAU] — stop when the drafted token's probability < TAU (default 0.4)",
    ),
    "entropy": (
        lambda arg: EntropyStop(float(arg) if arg else 2.0),
        "entropy[:H] — stop when the draft's entropy > H nats (default 2.0)",
    ),
    "specdec": (
        lambda arg: SpecDecStop(float(arg) if arg else 0.7),
        "specdec[:H] — SpecDec++'s rule: stop when the shipped acceptance predictor says P(some drafted token is rejected) > H (default 0.7)",
    ),
    "suffix": (
        lambda arg: SuffixRule(float(arg) if arg else 1.0),
        "suffix[:FACTOR] — SuffixDecoding's rule for the copy drafter: at most match length × FACTOR tokens, stop below probability 0.1 (default FACTOR 1)",
    ),
    "costmodel": (
        lambda arg: CostModelPolicy(c=float(arg) if arg else None),
        "costmodel[:C] — γ* from a running α and C (default: C measured online)",
    ),
}


def _required_int(arg: str | None, name: str) -> int:
    if not arg:
        raise ValueError(f"policy '{name}' needs a value, e.g. '{name}:4'")
    return int(arg)


def make_policy(spec: str, pair: str | None = None) -> DraftPolicy:
    """Build a baseline policy from its spec string, or load a learned one from a path (a training run
    folder, a policy folder or its ``policy.json``); given ``pair``, a learned policy must have been trained for it.

    Example:
        >>> make_policy("static:4").name
        'static:4'
    """
    if Path(spec).exists():
        return load_policy(spec, pair=pair)
    name, _, arg = spec.partition(":")
    if name not in POLICY_SPECS:
        allowed = "; ".join(help_text for _, help_text in POLICY_SPECS.values())
        raise ValueError(f"unknown policy {spec!r}; allowed: {allowed}; or the path of a learned policy (run folder or policy.json)")
    factory, help_text = POLICY_SPECS[name]
    try:
        return factory(arg or None)
    except ValueError as error:
        raise ValueError(f"bad policy spec {spec!r} ({help_text}): {error}") from error
