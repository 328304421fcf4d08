"""An acceptance predictor (SpecDec++ style) and the stopping rule built on it.

The predictor is a logistic regression over what the decoder already computes at every draft step — the draft's
top-1 probability, its entropy, the drafted token's log-probability, the top-1/top-2 margin — and the step's depth
in the round: the probability that this drafted token is accepted given that every earlier one of the round was. It
is fitted on replay traces of the training side (never val or test) by :func:`lab.acceptance.fit_predictor` and
stored as JSON (a few floats; nothing is unpickled).

:class:`SpecDecStop` is SpecDec++'s stopping rule (Huang et al., COLM 2025): stop drafting once the probability that
at least one drafted token of the round is rejected, 1 − Π p_k, exceeds a threshold.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from adaptive.files import read_json
from adaptive.pair import ASSETS
from adaptive.policy import BasePolicy, DraftState, DraftStep

COLUMNS = ("top1", "entropy", "log_prob", "margin", "log_depth")
"""The predictor's inputs, in order: the step's features (:data:`adaptive.sampling.STEP_FEATURES`) and log(depth)."""
FORMAT = "acceptance-predictor/1"
SHIPPED = ASSETS / "smollm2-135m-acceptance" / "predictor.json"
"""The default pair's predictor, fitted on its train traces (``adaptive fit-acceptance``)."""


def design(features: np.ndarray, depths: np.ndarray) -> np.ndarray:
    """Rows of :data:`COLUMNS` from step features ``[n, 4]`` (STEP_FEATURES order) and depths ``[n]`` (1-based)."""
    return np.column_stack([np.asarray(features, dtype=np.float64), np.log(np.asarray(depths, dtype=np.float64))])


@dataclass(frozen=True)
class AcceptancePredictor:
    """P(a drafted token is accepted | the round's earlier tokens were) = σ(w · standardised(x) + b)."""

    weights: tuple[float, ...]
    bias: float
    mean: tuple[float, ...]
    scale: tuple[float, ...]
    metadata: dict = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if not len(self.weights) == len(self.mean) == len(self.scale) == len(COLUMNS):
            raise ValueError(f"an acceptance predictor has {len(COLUMNS)} weights, means and scales ({', '.join(COLUMNS)})")

    def probabilities(self, rows: np.ndarray) -> np.ndarray:
        """P(accepted) for design rows ``[n, len(COLUMNS)]``."""
        logits = ((rows - np.array(self.mean)) / np.array(self.scale)) @ np.array(self.weights) + self.bias
        return 1.0 / (1.0 + np.exp(-logits))

    def probability(self, step: DraftStep, depth: int) -> float:
        """P(accepted) of one drafted step at ``depth`` (1-based) of its round."""
        x = (step.top1_prob, step.entropy, step.log_prob, step.margin, math.log(depth))
        logit = self.bias + sum(w * (v - m) / s for w, v, m, s in zip(self.weights, x, self.mean, self.scale))
        return 1.0 / (1.0 + math.exp(-logit))

    def save(self, path: str | Path) -> None:
        """Write it as JSON."""
        document = {"format": FORMAT, "columns": list(COLUMNS), "weights": list(self.weights), "bias": self.bias}
        document |= {"mean": list(self.mean), "scale": list(self.scale), "metadata": self.metadata}
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(document, indent=1))

    @classmethod
    def load(cls, path: str | Path) -> AcceptancePredictor:
        """Read one written by :meth:`save`; anything else is refused by name."""
        document = read_json(path, "acceptance predictor")
        if document.get("format") != FORMAT or document.get("columns") != list(COLUMNS):
            raise ValueError(f"{path} is not an acceptance predictor ({FORMAT} over {', '.join(COLUMNS)}); write one with adaptive fit-acceptance")
        weights, mean, scale = (tuple(float(v) for v in document[key]) for key in ("weights", "mean", "scale"))
        return cls(weights, float(document["bias"]), mean, scale, metadata=document.get("metadata", {}))


class SpecDecStop(BasePolicy):
    """SpecDec++'s rule: stop once P(some drafted token of the round is rejected) = 1 − Π p_k exceeds ``threshold``
    (the token that crosses it is still verified, as with ``confidence``)."""

    def __init__(self, threshold: float = 0.7, predictor: AcceptancePredictor | None = None) -> None:
        if not 0.0 < threshold < 1.0:
            raise ValueError(f"the rejection threshold must be in (0, 1), got {threshold}")
        self.threshold = threshold
        self.predictor = predictor or AcceptancePredictor.load(SHIPPED)
        self.name = f"specdec:{threshold:g}"

    def should_continue(self, state: DraftState) -> bool:
        survive = 1.0
        for depth, step in enumerate(state.steps, 1):
            survive *= self.predictor.probability(step, depth)
        return 1.0 - survive <= self.threshold
