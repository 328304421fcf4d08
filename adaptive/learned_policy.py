"""Learned policies at inference: plain torch MLPs (no SB3 in the decoding loop), saved as safetensors
weights plus a JSON sidecar, and loaded without unpickling. Training (:mod:`lab.training`) exports them.

The sidecar records the observation schema, what the actions mean, the pair, the cost-profile constants
the observations embed (c and g), and the hash of the training config. Loading checks the schema (and,
when given, the pair): a policy trained on other observations fails with a message saying what differs.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from adaptive.files import UnreadableFile, load_weights, read_json, read_tensors
from adaptive.observation import ObservationBuilder, ObservationSchema, SchemaMismatch
from adaptive.policy import SOURCES, BasePolicy, DraftState

FORMAT = "adaptive-draft/policy/1"
WEIGHTS, SIDECAR = "policy.safetensors", "policy.json"
ACTIONS = {
    "depth": "argmax over 2 logits after each draft step: 0 = stop and verify, 1 = draft another token",
    "size": "argmax over max_depth logits after drafting: a -> verify a + 1 drafted tokens (at most the depth)",
    "source": "argmax over 3 logits before drafting: a -> SOURCES[a] (model, copy, copy+model) drafts the round",
}


def mlp(sizes: list[int]) -> torch.nn.Sequential:
    """Linear layers with tanh between them (SB3's MlpPolicy default), no activation at the output."""
    layers: list[torch.nn.Module] = []
    for i, (n_in, n_out) in enumerate(zip(sizes, sizes[1:])):
        layers.append(torch.nn.Linear(n_in, n_out))
        if i < len(sizes) - 2:
            layers.append(torch.nn.Tanh())
    return torch.nn.Sequential(*layers)


def numpy_layers(net: torch.nn.Sequential) -> list[tuple[np.ndarray, np.ndarray]]:
    """An exported MLP's (weight, bias) pairs as float64 NumPy arrays, for :func:`numpy_forward`."""
    return [(m.weight.detach().double().numpy().T.copy(), m.bias.detach().double().numpy().copy()) for m in net if isinstance(m, torch.nn.Linear)]


def numpy_forward(layers: list[tuple[np.ndarray, np.ndarray]], x: np.ndarray) -> np.ndarray:
    """The MLP's output for ``x`` (tanh between layers), in NumPy: microseconds instead of a torch call."""
    for i, (weight, bias) in enumerate(layers):
        x = x @ weight + bias
        if i < len(layers) - 1:
            x = np.tanh(x)
    return x


class LearnedPolicy(BasePolicy):
    """Depth (and optionally verification-size and source) decisions from exported MLPs.

    The MLPs are torch modules (``depth_net``, ``size_net``, ``source_net``); in the decoding loop their
    weights are applied with NumPy, which costs about 10 µs per decision instead of about 50 µs for a torch
    call on a 38-float input. Without a size network every drafted token is verified (the chain default);
    without a source network the model drafts every round; without a depth network (a partner while only
    the source policy has been trained) rounds draft to their cap."""

    reads_step_features = True

    def __init__(
        self,
        depth_net: torch.nn.Sequential | None,
        metadata: dict,
        size_net: torch.nn.Sequential | None = None,
        source_net: torch.nn.Sequential | None = None,
    ) -> None:
        self.depth_net = None if depth_net is None else depth_net.eval()
        self.size_net = None if size_net is None else size_net.eval()
        self.source_net = None if source_net is None else source_net.eval()
        self._depth_layers = None if depth_net is None else numpy_layers(self.depth_net)
        self._size_layers = None if size_net is None else numpy_layers(self.size_net)
        self._source_layers = None if source_net is None else numpy_layers(self.source_net)
        self.metadata = metadata
        self.schema = ObservationSchema.of(metadata["schema"])
        self._builder = ObservationBuilder(self.schema, metadata["profile"]["c"], metadata["profile"]["g"])
        self.name = metadata.get("name", "learned")
        self.reset()

    def observation(self, state: DraftState) -> np.ndarray:
        """The observation the environment would have shown in this state.

        Within a round only the steps drafted since the last decision are added (the decoder shows the same
        step objects all round); any other state (a new round, recomputed features) rebuilds the round."""
        builder, seen = self._builder, self._round_steps
        steps = state.steps[: self.schema.max_depth]
        key = (state.context_length, state.source, state.recent_accepted)
        if key != self._round_key or len(seen) > len(steps) or any(a is not b for a, b in zip(seen, steps)):
            builder.new_round(state.recent_accepted, state.source, state.copy_match, state.copy_first)
            self._round_key, seen = key, ()
        for depth, step in enumerate(steps[len(seen) :], start=len(seen) + 1):
            builder.add_step(depth, step.top1_prob, step.entropy, step.cumulative_log_prob, step.match_length, step.margin)
        self._round_steps = steps
        if self.schema.tree:
            builder.set_tree(state.tree_ranked, state.tree_level_mass)
        depth = min(state.depth, self.schema.max_depth)
        return builder.build(depth, min(state.max_depth, self.schema.max_depth), state.context_length, state.generated)

    def reset(self) -> None:
        """Forget the round the observation was built for."""
        self._round_key, self._round_steps = None, ()

    def source(self, state: DraftState) -> str:
        if self._source_layers is None:
            return "model"
        return SOURCES[int(numpy_forward(self._source_layers, self.observation(state)).argmax())]

    def should_continue(self, state: DraftState) -> bool:
        if state.depth >= self.schema.max_depth:
            return False
        if self._depth_layers is None:
            return True
        return bool(numpy_forward(self._depth_layers, self.observation(state)).argmax() == 1)

    @property
    def sizes_trees(self) -> bool:
        """True for a size network trained on draft trees: its sizes count tree nodes."""
        return self._size_layers is not None and self.metadata.get("tree") is not None

    def verify_size(self, state: DraftState) -> int:
        """Chains: drafted tokens to verify (1..depth). Trees (:attr:`sizes_trees`): tree nodes to verify,
        which the caller clips to the nodes the tree has."""
        if self.sizes_trees:
            return int(numpy_forward(self._size_layers, self.observation(state)).argmax()) + 1
        if self._size_layers is None or state.depth <= 1:
            return state.depth
        return min(state.depth, int(numpy_forward(self._size_layers, self.observation(state)).argmax()) + 1)


def save_policy(
    folder: str | Path,
    depth_net: torch.nn.Sequential | None,
    metadata: dict,
    size_net: torch.nn.Sequential | None = None,
    source_net: torch.nn.Sequential | None = None,
) -> Path:
    """Write ``policy.safetensors`` and ``policy.json`` into ``folder``; returns the sidecar path."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, net in (("depth", depth_net), ("size", size_net), ("source", source_net)):
        if net is not None:
            tensors.update({f"{name}.{k}": v.detach().contiguous() for k, v in net.state_dict().items()})
    save_file(tensors, folder / WEIGHTS)
    sidecar = {"format": FORMAT, "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "actions": ACTIONS, **metadata}
    sidecar["size_layers"] = sidecar.get("size_layers") if size_net is not None else None
    sidecar["source_layers"] = sidecar.get("source_layers") if source_net is not None else None
    (folder / SIDECAR).write_text(json.dumps(sidecar, indent=1))
    return folder / SIDECAR


def policy_sidecar(path: Path) -> Path:
    """The ``policy.json`` a path names: itself, the one in a policy folder, or a training run's ``final/`` one (its
    weights, ``policy.safetensors``, lie beside it)."""
    for candidate in (path, path / SIDECAR, path / "final" / SIDECAR):
        if candidate.is_file() and candidate.name == SIDECAR:
            return candidate
    raise UnreadableFile(f"no {SIDECAR} at {path} (give a policy folder, its {SIDECAR}, or a training run folder)")


def load_policy(path: str | Path, schema: ObservationSchema | None = None, pair: str | None = None) -> LearnedPolicy:
    """Load a learned policy (a run folder, a policy folder or its ``policy.json``) for the decoder. Unpickles nothing.

    Raises ``SchemaMismatch`` when ``schema`` is given and differs from the policy's, and ``ValueError``
    when ``pair`` is given and the policy was trained for another pair, or when the files are not a
    well-formed policy (each message names the file and what was expected)."""
    sidecar = policy_sidecar(Path(path))
    metadata = read_json(sidecar, "policy")
    if metadata.get("format") != FORMAT:
        found = metadata.get("format")
        hint = "; a batch policy drives adaptive loadtest, not the single-request decoder" if "batch" in str(found) else ""
        raise UnreadableFile(f"{sidecar} is not a policy of format {FORMAT} (found {found!r}){hint}")
    try:
        described = ObservationSchema.of(metadata["schema"])
        layers = {name: _layers(metadata, name, described.size) for name in ("depth", "size", "source")}
        ObservationBuilder(described, float(metadata["profile"]["c"]), [float(g) for g in metadata["profile"]["g"]])
    except (KeyError, TypeError, ValueError) as error:
        if isinstance(error, SchemaMismatch):
            raise
        raise UnreadableFile(f"policy {sidecar} is malformed ({type(error).__name__}: {error}); re-export it with adaptive train") from None
    if not any(layers.values()):
        raise UnreadableFile(f"policy {sidecar} names no network (depth_layers, size_layers or source_layers)")
    if schema is not None:
        schema.check(metadata["schema"])
    if pair is not None and metadata.get("pair") != pair:
        raise ValueError(f"policy {sidecar} was trained for pair {metadata.get('pair')!r}, not {pair!r}")
    tensors = read_tensors(sidecar.parent / WEIGHTS, "policy weights")
    nets = {}
    for name, sizes in layers.items():
        if sizes:
            nets[name] = mlp(sizes)
            own = {k.removeprefix(f"{name}."): v for k, v in tensors.items() if k.startswith(f"{name}.")}
            load_weights(nets[name], own, sidecar.parent / WEIGHTS, f"policy weights ({name} network of {sizes})")
    return LearnedPolicy(nets.get("depth"), metadata, nets.get("size"), nets.get("source"))


def _layers(metadata: dict, name: str, observation_size: int) -> list[int] | None:
    """A network's layer sizes from a policy sidecar, checked: whole positive numbers, input = the observation."""
    sizes = metadata.get(f"{name}_layers")
    if sizes is None:
        return None
    if not isinstance(sizes, list) or len(sizes) < 2 or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in sizes):
        raise ValueError(f"{name}_layers must list two or more positive layer sizes, got {sizes!r}")
    if sizes[0] != observation_size:
        raise ValueError(f"{name}_layers takes {sizes[0]} inputs; its observation schema has {observation_size}")
    return sizes
