"""A learned batch policy: one MLP from the batch observation (:mod:`adaptive.batch_observation`) to a
decision — with observation version 1 the round's depth, with version 2 before each draft step whether the
batch drafts another token — saved as ``policy.safetensors`` + ``policy.json`` (format
``adaptive-draft/batch-policy/1``, with its observation schema and the batched cost profile it reads costs
from). Loading never unpickles."""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from adaptive.batch_observation import BatchObservationSchema, RoundHead
from adaptive.batch_profile import BatchCostProfile
from adaptive.files import UnreadableFile, load_weights, read_json, read_tensors
from adaptive.learned_policy import mlp, numpy_forward, numpy_layers
from adaptive.policy import BatchDraftStep, BatchState

FORMAT = "adaptive-draft/batch-policy/1"
WEIGHTS, SIDECAR = "policy.safetensors", "policy.json"


DEPTH_ACTIONS = "depth = action (0: plain batched step)"
STEP_ACTIONS = "before each draft step: 1 = every drafting request drafts one more token, 0 = verify now"


class LearnedBatchPolicy:
    """Per round (observation version 1): depth = arg-max of the MLP's logits over 0..max_depth. Applied with
    NumPy: microseconds per decision (the round's part of the observation is computed once per round)."""

    def __init__(self, net: torch.nn.Sequential, metadata: dict) -> None:
        self.net = net.eval()
        self.metadata = metadata
        self.schema = BatchObservationSchema.described(metadata["schema"])
        self.profile = BatchCostProfile.from_dict(metadata["profile"], "the policy's batched cost profile")
        self.layers = numpy_layers(self.net)
        self.name = metadata.get("name", "learned-batch")
        self._round: tuple[BatchState, RoundHead] | None = None

    def _decide(self, state: BatchState, step: BatchDraftStep | None = None) -> int:
        if self._round is None or self._round[0] is not state:  # the decoder shows one state per round, to every step
            self._round = (state, self.schema.head(state, self.profile))
        return int(numpy_forward(self.layers, self.schema.with_step(self._round[1], step)).argmax())

    def depth(self, state: BatchState) -> int:
        return min(self._decide(state), self.schema.max_depth, state.max_depth)


class LearnedSteppedBatchPolicy(LearnedBatchPolicy):
    """Per step (observation version 2, a :class:`~adaptive.policy.SteppedBatchPolicy`): before each draft
    step, the batch drafts one more token while the MLP's arg-max says 1, up to max_depth."""

    def depth(self, state: BatchState) -> int:
        return min(self.schema.max_depth, state.max_depth) if self._decide(state) else 0

    def should_continue(self, state: BatchState, step: BatchDraftStep) -> bool:
        return bool(self._decide(state, step))


def save_batch_policy(
    folder: str | Path, net: torch.nn.Sequential, layers: list[int], schema: BatchObservationSchema, profile: BatchCostProfile, **metadata
) -> Path:
    """Write the policy into ``folder``; returns the sidecar's path."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().contiguous() for k, v in net.state_dict().items()}, folder / WEIGHTS)
    sidecar = {
        "format": FORMAT,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "actions": STEP_ACTIONS if schema.stepwise else DEPTH_ACTIONS,
        "schema": schema.describe(),
        "layers": layers,
        "profile": profile.document,
        **metadata,
    }
    (folder / SIDECAR).write_text(json.dumps(sidecar, indent=1))
    return folder / SIDECAR


def is_batch_policy(path: str | Path) -> bool:
    """Whether ``path`` (a folder holding ``policy.json``, or the file) is a learned batch policy."""
    sidecar = Path(path) / SIDECAR if Path(path).is_dir() else Path(path)
    try:
        return sidecar.is_file() and json.loads(sidecar.read_text()).get("format") == FORMAT
    except (OSError, ValueError):
        return False


def load_batch_policy(path: str | Path) -> LearnedBatchPolicy:
    """A saved learned batch policy (its folder, or its ``policy.json``)."""
    sidecar = Path(path) / SIDECAR if Path(path).is_dir() else Path(path)
    metadata = read_json(sidecar, "batch policy")
    if metadata.get("format") != FORMAT:
        raise UnreadableFile(f"{sidecar} is not a learned batch policy ({SIDECAR} of format {FORMAT}; found {metadata.get('format')!r})")
    layers = metadata.get("layers")
    if not isinstance(layers, list) or len(layers) < 2 or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in layers):
        raise UnreadableFile(f"batch policy {sidecar}: 'layers' must list two or more positive layer sizes, got {layers!r}")
    net = mlp(layers)
    load_weights(net, read_tensors(sidecar.parent / WEIGHTS, "batch policy weights"), sidecar.parent / WEIGHTS, "batch policy weights")
    try:
        stepwise = BatchObservationSchema.described(metadata["schema"]).stepwise
    except (KeyError, TypeError) as error:
        raise UnreadableFile(f"batch policy {sidecar} is malformed ({type(error).__name__}: {error})") from None
    return (LearnedSteppedBatchPolicy if stepwise else LearnedBatchPolicy)(net, metadata)
