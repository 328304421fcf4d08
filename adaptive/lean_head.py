"""EAGLE-3 heads on the lean engines: an int8 copy of a head's matrices under low-bit weights, and its own-state
step compiled by inductor under the compiled engines (:func:`adaptive.engines.use_engine` attaches them)."""

from __future__ import annotations

import torch
from tqdm import tqdm

from adaptive.eagle3 import Eagle3Head, rotary
from adaptive.lean import CACHE_BLOCK, LeanLinear, fused_attention, inputs_only, own_code, use_inductor_cache

HEAD_WEIGHTS = {"model": "model", "int8": "int8", "int4": "int8", "int8-aten": "int8-aten", "int4-aten": "int8-aten"}
"""How an EAGLE-3 head holds its matrices under each engine's :data:`WEIGHTS`: its own dtype under ``model``, else int8
(one draft step of the default head: 0.99 ms bf16, 0.44 ms int8, 0.45 ms int4: past int8 the step is not its matrices)."""


class HeadStep:
    """An EAGLE-3 head's entry made from its own last output state (each drafted token after a round's first), compiled
    by inductor: the layer's small ops fused, attention included (:func:`fused_attention`)."""

    def __init__(self, head: Eagle3Head, dtype: torch.dtype) -> None:
        self.head = head
        self.dtype = dtype
        self.step = torch.compile(own_code(self._step), dynamic=None, fullgraph=True, options={"guard_filter_fn": inputs_only})

    @torch.inference_mode()
    def __call__(self, token: torch.Tensor, state: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The new entry's output state ``[1, H]`` and logits ``[1, V]`` over the target vocabulary, for ``token [1]``
        read with ``state [1, H]`` at position ``end - 1``; its key and value are written to slot ``end - 1`` of
        ``keys``/``values`` ``[kv_heads, capacity, dim]`` (capacity > end) and it attends over slots ``[0, end)``."""
        return self.step(token, state, keys, values, end)

    def _step(self, token: torch.Tensor, state: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        head, config = self.head, self.head.config
        layer, attention = head.midlayer, head.midlayer.self_attn
        position = torch.full((1,), end - 1, dtype=torch.long, device=token.device)
        cos, sin = rotary(position, config.head_dim, config.rope_theta, state.dtype)
        queries, key, value = attention.project(layer.inputs(head.embedding(token), state), cos, sin)
        keys[:, end - 1 : end] = key
        values[:, end - 1 : end] = value
        kv_heads, dim = config.num_key_value_heads, config.head_dim
        attended = fused_attention(queries.reshape(kv_heads, -1, dim), keys[:, :end], values[:, :end])
        out = layer.finish(state, attention.o_proj(attended.reshape(1, -1)))
        return out, head.target_logits(out)


def lean_head(head: Eagle3Head, kind: str, compiled: bool = False) -> Eagle3Head:
    """A copy of ``head`` (sharing the target's embedding) whose matrices are :class:`LeanLinear` products of ``kind``;
    ``compiled``: with a compiled :class:`HeadStep` as ``own_step``, compiled now (:func:`compile_head_step`)."""
    lean = Eagle3Head(head.config, head.embedding).to(device=head.device, dtype=head.fc.weight.dtype)
    lean.load_state_dict(head.state_dict())
    layer = lean.midlayer
    matrices = {lean: ("fc", "lm_head"), layer.self_attn: ("q_proj", "k_proj", "v_proj", "o_proj"), layer.mlp: ("gate_proj", "up_proj", "down_proj")}
    for parent, names in matrices.items():
        for name in names:
            setattr(parent, name, LeanLinear(getattr(parent, name), kind))
    lean.eval()
    if compiled:
        lean.own_step = HeadStep(lean, head.fc.weight.dtype)
        compile_head_step(lean.own_step)
    return lean


def drafting_head(head: Eagle3Head) -> Eagle3Head:
    """The head a session drafts with: the lean copy :func:`use_engine` attached, else ``head`` itself."""
    lean = head.__dict__.get("lean_engine")
    return head if lean is None else lean


HEAD_STEP_DYNAMIC = r"L\['end'\],L\['(keys|values)'\]:1"
"""The head step's varying sizes (the context and the cache's capacity), dynamic from the first call (as
:data:`adaptive.lean.STEP_DYNAMIC`)."""


def compile_head_step(step: HeadStep) -> None:
    """Compile a head's own-state step before any timed work, with a progress bar, for a first cache and a grown one
    (as :func:`compile_step`; artefacts cached in the same place)."""
    use_inductor_cache()
    config, head, dtype = step.head.config, step.head, step.dtype
    dynamic = torch.compiler.config.patch(dynamic_sources=HEAD_STEP_DYNAMIC)
    with tqdm(total=2, desc="compiling the head's step", unit="graph") as progress, torch.inference_mode(), dynamic:  # as sessions make their tensors
        for capacity in (CACHE_BLOCK, 2 * CACHE_BLOCK):
            keys = torch.zeros(config.num_key_value_heads, capacity, config.head_dim, dtype=dtype, device=head.device)
            token = torch.zeros(1, dtype=torch.long, device=head.device)
            step(token, torch.zeros(1, config.hidden_size, dtype=dtype, device=head.device), keys, keys.clone(), capacity - CACHE_BLOCK + 2)
            progress.update()
