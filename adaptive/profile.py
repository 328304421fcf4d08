"""A hardware cost profile of a model pair, as one object: read, written, derived and queried here; measured
by :mod:`adaptive.profiling`.

The profile holds the median draft step time and target forward time of 1..N tokens at a few context
lengths, and its summary at a reference context: ``c`` (draft step / target step) and ``g[γ]``
(verification of γ drafted tokens, γ + 1 fed, / target step). The cost model, the environments, training
and evaluation consume it; load it once per run and pass the object down. Between measured context lengths
times are interpolated linearly; beyond them the nearest is used.

On disk it is the JSON document ``adaptive profile`` writes; :attr:`CostProfile.document` keeps that
document whole (quartiles, provenance), so a loaded profile saves back unchanged.
"""

from __future__ import annotations

import copy
import json
from bisect import bisect_left
from dataclasses import dataclass, field
from pathlib import Path

from adaptive.files import UnreadableFile, read_json

REQUIRED_KEYS = ("contexts", "reference_context", "draft_step", "verify", "c", "g", "target_step_ms", "hardware")
QUANTILES = ("median_ms", "p25_ms", "p75_ms")


@dataclass(frozen=True)
class CostProfile:
    """Measured step times of a model pair as functions of context length and tokens verified."""

    contexts: tuple[int, ...]
    draft_ms: tuple[float, ...]
    """Median draft step time per context."""
    verify_ms: tuple[tuple[float, ...], ...]
    """``verify_ms[i][n - 1]``: median target forward time of n tokens at contexts[i]."""
    c: float
    g: tuple[float, ...]
    """``g[γ]``: verification cost of γ drafted tokens (γ + 1 forwarded) relative to one target step."""
    target_step_ms: float
    hardware: dict
    copy_ms: tuple[float, ...] | None = None
    """Median copy-drafter step time per context (profiles measured before it existed have none)."""
    draft_run_ms: tuple[tuple[float, ...], ...] | None = None
    """``draft_run_ms[i][k]``: median time of a round's draft step k + 1 at contexts[i], the steps drafted back to back after
    a target forward (profiles measured before 2026-12-06 have none: every step then costs ``draft_ms``)."""
    catch_up_ms: tuple[tuple[float, ...], ...] | None = None
    """``catch_up_ms[i][n - 1]``: median time of a round's first draft step at contexts[i] when the last verification emitted
    n tokens, which the draft reads first (profiles measured before 2026-12-07 have none: the first step then costs
    ``draft_run_ms``'s first)."""
    round_work_ms: dict[str, float] | None = None
    """The decoder's own work per round outside model forwards, fitted: ``draft_fixed_ms`` + ``draft_token_ms`` per
    drafted token, ``verify_fixed_ms`` + ``verify_token_ms`` per verified token (older profiles: none, charged 0)."""
    prefill_ms: dict[str, dict[str, float]] | None = None
    """A generation's time outside its rounds (prompt prefill and set-up) by decoding kind (``plain``, ``speculative``),
    fitted: ``fixed_ms`` + ``token_ms`` per prompt token (profiles measured before 2026-12-07 have none)."""
    tree_round_work_ms: dict[str, float] | None = None
    """What a tree round adds, fitted from a tree decode (profiles measured with the tree mask since 2026-12-07; before,
    a level was priced as a chain's draft step and the chain decoder's ``round_work``): ``level_forward_ms`` per later
    level's masked draft forward over W nodes; the decoder's own work, ``draft_fixed_ms`` + ``draft_level_ms`` per level
    grown and ``verify_fixed_ms`` + ``verify_node_ms`` per verified node."""
    document: dict = field(default_factory=dict, repr=False, compare=False)
    """The JSON document this profile was read from or measured as (empty for one built in code)."""

    @classmethod
    def from_dict(cls, document: dict, source: str = "profile") -> CostProfile:
        """Parse a profile document; ``source`` names it in errors."""
        missing = [key for key in REQUIRED_KEYS if key not in document]
        if missing:
            raise ValueError(f"{source} is not a cost profile: key {missing[0]!r} is missing (written by `adaptive profile`)")
        contexts = tuple(sorted(int(c) for c in document["contexts"]))
        verify = tuple(tuple(document["verify"][str(c)][str(n)]["median_ms"] for n in range(1, len(document["verify"][str(c)]) + 1)) for c in contexts)
        return cls(
            contexts=contexts,
            draft_ms=tuple(document["draft_step"][str(c)]["median_ms"] for c in contexts),
            verify_ms=verify,
            c=float(document["c"]),
            g=tuple(float(document["g"][str(gamma)]) for gamma in range(len(document["g"]))),
            target_step_ms=float(document["target_step_ms"]),
            hardware=dict(document["hardware"]),
            copy_ms=tuple(document["copy_step"][str(c)]["median_ms"] for c in contexts) if "copy_step" in document else None,
            draft_run_ms=tuple(tuple(p["median_ms"] for p in document["draft_run"][str(c)]) for c in contexts) if "draft_run" in document else None,
            catch_up_ms=tuple(tuple(p["median_ms"] for p in document["draft_catch_up"][str(c)]) for c in contexts) if document.get("draft_catch_up") else None,
            round_work_ms=dict(document["round_work"]) if "round_work" in document else None,
            prefill_ms={kind: dict(document["prefill"][kind]) for kind in ("plain", "speculative")} if "prefill" in document else None,
            tree_round_work_ms=dict(document["tree_round_work"]) if "tree_round_work" in document else None,
            document=document,
        )

    @classmethod
    def load(cls, path: str | Path) -> CostProfile:
        """Read a profile JSON written by ``adaptive profile`` (or :meth:`save`)."""
        try:
            return cls.from_dict(read_json(path, "cost profile"), str(path))
        except (KeyError, TypeError, IndexError) as error:
            raise UnreadableFile(f"cost profile {path} is malformed ({type(error).__name__}: {error}); write it again with adaptive profile") from None

    def save(self, path: str | Path) -> None:
        """Write the profile document as JSON."""
        if not self.document:
            raise ValueError("this profile was built in code, not measured or loaded: it has no document to save")
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(self.document, indent=1))

    def with_metadata(self, **entries) -> CostProfile:
        """The same profile with extra top-level entries in its document (e.g. ``pair=...``)."""
        return CostProfile.from_dict({**self.document, **entries})

    def scaled(self, verify_slope: float, draft_scale: float) -> CostProfile:
        """A what-if profile: every extra verified token costs ``verify_slope`` times what it was measured to
        cost (a machine with more parallel compute), and every draft step ``draft_scale`` times. Marked as
        derived in its ``hardware`` entry."""
        if verify_slope < 0 or draft_scale <= 0:
            raise ValueError(f"verify_slope must be >= 0 and draft_scale > 0, got {verify_slope} and {draft_scale}")
        measured = self.document
        derived = copy.deepcopy(measured)
        for ctx, row in derived["verify"].items():
            base = measured["verify"][ctx]["1"]["median_ms"]
            for n, point in row.items():
                for key in QUANTILES:
                    point[key] = base + verify_slope * (measured["verify"][ctx][n][key] - base)
        runs = [*derived.get("draft_run", {}).values(), *derived.get("draft_catch_up", {}).values()]
        for point in [*derived["draft_step"].values(), *(p for run in runs for p in run)]:
            for key in QUANTILES:
                point[key] *= draft_scale
        summarise(derived)
        derived["hardware"] = {**measured["hardware"], "what_if": f"derived: verify slope x{verify_slope:g}, draft step x{draft_scale:g}"}
        return CostProfile.from_dict(derived)

    @property
    def target_step_seconds(self) -> float:
        """One plain target step at the reference context: the unit every speedup is measured in."""
        return self.target_step_ms / 1e3

    @property
    def engine(self) -> str:
        """The forward the profile timed (:data:`adaptive.engines.ENGINES`; eager for profiles that predate engines)."""
        return self.document.get("engine", "eager")

    @property
    def max_verify(self) -> int:
        """Largest number of drafted tokens the profile can time in one verification."""
        return len(self.verify_ms[0]) - 1

    def g_curve(self) -> dict[int, float]:
        """g as the cost model takes it: ``{γ: g(γ)}``."""
        return dict(enumerate(self.g))

    def _interpolate(self, values: list[float] | tuple[float, ...], context: int) -> float:
        contexts = self.contexts
        if context <= contexts[0]:
            return values[0]
        if context >= contexts[-1]:
            return values[-1]
        i = bisect_left(contexts, context)
        share = (context - contexts[i - 1]) / (contexts[i] - contexts[i - 1])
        return values[i - 1] + share * (values[i] - values[i - 1])

    def draft_seconds(self, context: int) -> float:
        """One draft step at this context length (the mean of a round's first steps where the profile has them)."""
        return self._interpolate(self.draft_ms, context) / 1e3

    def drafting_seconds(self, context: int, steps: int, emitted: int | None = None) -> float:
        """A round's ``steps`` draft steps at this context length, each priced by its position in the round (the
        first after the target's forward the dearest; steps past the measured run at the last one's price); without
        a measured run, ``steps`` times :meth:`draft_seconds`. With ``emitted`` (what the last verification emitted:
        its accepted tokens + 1) and a profile that times it, the first step is priced as reading those first."""
        if self.draft_run_ms is None:
            return steps * self.draft_seconds(context)
        run = [self._interpolate([row[k] for row in self.draft_run_ms], context) for k in range(len(self.draft_run_ms[0]))]
        if steps and emitted is not None and self.catch_up_ms is not None:
            run[0] = self._catch_up_ms(context, emitted)
        return (sum(run[:steps]) + max(0, steps - len(run)) * run[-1]) / 1e3

    def _catch_up_ms(self, context: int, emitted: int) -> float:
        """The first draft step after a verification that emitted ``emitted`` tokens (past the measured ones: the
        last measured step's cost per token more for each)."""
        curve = [self._interpolate([row[n] for row in self.catch_up_ms], context) for n in range(len(self.catch_up_ms[0]))]
        if emitted <= len(curve):
            return curve[max(1, emitted) - 1]
        slope = max(0.0, curve[-1] - curve[-2]) if len(curve) > 1 else 0.0
        return curve[-1] + slope * (emitted - len(curve))

    def drafting_work_seconds(self, steps: int) -> float:
        """The decoder's own work while drafting ``steps`` tokens, outside the draft's forwards (0 if not measured)."""
        work = self.round_work_ms
        return 0.0 if work is None else (work["draft_fixed_ms"] + steps * work["draft_token_ms"]) / 1e3

    def verifying_work_seconds(self, size: int) -> float:
        """The decoder's own work in verifying ``size`` tokens, outside the target's forward (0 if not measured)."""
        work = self.round_work_ms
        return 0.0 if work is None else (work["verify_fixed_ms"] + size * work["verify_token_ms"]) / 1e3

    def round_drafting_seconds(self, context: int, depth: int, emitted: int | None = None, tree: bool = False, copy_steps: int = 0) -> float:
        """What replay charges a round's drafting at this context: ``depth`` steps of a chain (``copy_steps`` of them the
        copy drafter's, whose reads are charged apart) or levels of a ``tree``, each with the decoder's own work; the
        first step priced as reading the ``emitted`` tokens of the last verification. A tree: the first level's draft
        step, each later level's masked forward over W nodes and the tree decoder's own work, where the profile timed
        them (:attr:`tree_round_work_ms`), else as a chain of ``depth`` steps."""
        work = self.tree_round_work_ms if tree else None
        if work is None:
            return self.drafting_seconds(context, depth - copy_steps, emitted) + self.drafting_work_seconds(depth)
        if not depth:
            return 0.0
        own = work["draft_fixed_ms"] + depth * work["draft_level_ms"]
        return self.drafting_seconds(context, 1, emitted) + ((depth - 1) * work["level_forward_ms"] + own) / 1e3

    def round_verifying_seconds(self, context: int, size: int, tree: bool = False) -> float:
        """What replay charges a round's verification of ``size`` tokens (a ``tree``'s: nodes) at this context: the
        target's forward and the decoder's own work (a tree's: the mask, acceptance along the path, compacting both
        caches, where the profile timed it, else a chain's)."""
        work = self.tree_round_work_ms if tree else None
        own = self.verifying_work_seconds(size) if work is None else (work["verify_fixed_ms"] + size * work["verify_node_ms"]) / 1e3
        return self.verify_seconds(context, size) + own

    def prefill_seconds(self, prompt_length: int, speculative: bool) -> float:
        """A generation's time outside its rounds for a prompt of ``prompt_length`` tokens: the prompt's prefill
        through the target (and the draft, ``speculative``) and per-call set-up."""
        if self.prefill_ms is None:
            raise ValueError("this profile has no prefill time (measured before 2026-12-07); measure a new one (adaptive profile, or --profile auto)")
        fitted = self.prefill_ms["speculative" if speculative else "plain"]
        return (fitted["fixed_ms"] + prompt_length * fitted["token_ms"]) / 1e3

    def copy_seconds(self, context: int) -> float:
        """One copy-drafter step at this context length."""
        if self.copy_ms is None:
            raise ValueError("this profile has no copy-drafter step time (measured before it existed); measure a new one (--profile auto)")
        return self._interpolate(self.copy_ms, context) / 1e3

    def verify_seconds(self, context: int, drafted: int) -> float:
        """One target forward verifying ``drafted`` tokens (``drafted + 1`` fed) at this context length."""
        if not 0 <= drafted <= self.max_verify:
            raise ValueError(f"the profile times verifications of 0..{self.max_verify} drafted tokens, not {drafted}")
        return self._interpolate([row[drafted] for row in self.verify_ms], context) / 1e3


def summarise(document: dict) -> None:
    """Fill a profile document's summary (``target_step_ms``, ``draft_step_ms``, ``c``, ``g``) from its
    measurements at the reference context, in place."""
    reference = document["verify"][str(document["reference_context"])]
    step = reference["1"]["median_ms"]
    document["target_step_ms"] = step
    document["draft_step_ms"] = document["draft_step"][str(document["reference_context"])]["median_ms"]
    document["c"] = document["draft_step_ms"] / step
    document["g"] = {str(gamma): reference[str(gamma + 1)]["median_ms"] / step for gamma in range(len(reference))}
