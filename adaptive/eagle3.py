"""A feature-conditioned draft head in the EAGLE-3 form, and its public on-disk layout.

The head reads the target's residual stream entering three of its layers (by default 2, L/2 and L-3; the
"aux hidden states"), fuses them with ``fc`` (3H -> H, no bias) and runs ONE decoder layer whose attention
takes ``[input_layernorm(token embedding) ; hidden_norm(fused state)]`` (2H) while its output projection
and MLP are H-sized and its residual is the fused state; a final norm and ``lm_head`` over a reduced draft
vocabulary follow. Draft id ``i`` means target id ``i + d2t[i]``; ``t2d`` marks the target ids the head can
propose. The token embedding is the target's, frozen. Later draft steps feed the layer's own pre-norm
output back in place of the fused target state (``fc`` is skipped). Rotary position embeddings as Llama.

The head's entry for sequence position t pairs the target's state at t with the embedding of token t + 1
and predicts token t + 2: the same shift EAGLE trains with.

Files (a folder, as public EAGLE-3 checkpoints store it): ``config.json`` (``hidden_size``,
``intermediate_size``, ``num_attention_heads``, ``num_key_value_heads``, ``head_dim``, ``rms_norm_eps``,
``rope_theta``, ``vocab_size``, ``draft_vocab_size``, ``eagle_config.eagle_aux_hidden_state_layer_ids``) and
``model.safetensors`` (``fc.weight``, ``midlayer.*``, ``norm.weight``, ``lm_head.weight``, ``d2t``, ``t2d``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from adaptive.files import UnreadableFile, load_weights, read_json, read_tensors

CONFIG, WEIGHTS = "config.json", "model.safetensors"
ARCHITECTURE = "LlamaForCausalLMEagle3"


def default_layer_ids(num_layers: int) -> tuple[int, int, int]:
    """The target layers whose incoming residual stream the head reads: 2, L/2 and L-3."""
    return (2, num_layers // 2, num_layers - 3)


@dataclass(frozen=True)
class Eagle3Config:
    """Shape of an EAGLE-3 head for a given target."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    vocab_size: int
    """The target's vocabulary."""
    draft_vocab_size: int
    layer_ids: tuple[int, int, int]
    """Target layers whose incoming residual stream is read (HF ``hidden_states[i]``)."""

    @classmethod
    def for_target(cls, target_config, draft_vocab_size: int, layer_ids: tuple[int, int, int] | None = None) -> Eagle3Config:
        """A head shaped like one layer of a Llama-family target."""
        heads = target_config.num_attention_heads
        rope = getattr(target_config, "rope_parameters", None) or {}
        return cls(
            hidden_size=target_config.hidden_size,
            intermediate_size=target_config.intermediate_size,
            num_attention_heads=heads,
            num_key_value_heads=getattr(target_config, "num_key_value_heads", heads),
            head_dim=getattr(target_config, "head_dim", None) or target_config.hidden_size // heads,
            rms_norm_eps=float(target_config.rms_norm_eps),
            rope_theta=float(rope.get("rope_theta", getattr(target_config, "rope_theta", 10_000.0))),
            vocab_size=target_config.vocab_size,
            draft_vocab_size=draft_vocab_size,
            layer_ids=tuple(layer_ids or default_layer_ids(target_config.num_hidden_layers)),
        )

    def to_json(self) -> dict:
        """The public layout's ``config.json``."""
        data = {key: value for key, value in asdict(self).items() if key != "layer_ids"}
        return {
            "architectures": [ARCHITECTURE],
            "model_type": "llama",
            "num_hidden_layers": 1,
            **data,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(self.layer_ids), "use_aux_hidden_state": True},
        }

    @classmethod
    def from_json(cls, data: dict, source: str = "config.json") -> Eagle3Config:
        """Read a public EAGLE-3 ``config.json``; missing ``head_dim`` / ``draft_vocab_size`` take their usual defaults."""
        for key in ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size"):
            if key not in data:
                raise ValueError(f"{source} is not an EAGLE-3 head config: {key!r} is missing")
        for key in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size", "draft_vocab_size"):
            if data.get(key) is not None and not (isinstance(data[key], int) and not isinstance(data[key], bool) and data[key] > 0):
                raise ValueError(f"{source}: {key} must be a positive whole number, got {data[key]!r}")
        layer_ids = (data.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        if layer_ids is None:
            raise ValueError(f"{source} names no target layers (eagle_config.eagle_aux_hidden_state_layer_ids); give them for this target, e.g. [2, L/2, L-3]")
        heads = data["num_attention_heads"]
        rope = data.get("rope_parameters") or {}
        return cls(
            hidden_size=data["hidden_size"],
            intermediate_size=data["intermediate_size"],
            num_attention_heads=heads,
            num_key_value_heads=data.get("num_key_value_heads", heads),
            head_dim=data.get("head_dim") or data["hidden_size"] // heads,
            rms_norm_eps=float(data.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope.get("rope_theta", data.get("rope_theta", 10_000.0))),
            vocab_size=data["vocab_size"],
            draft_vocab_size=data.get("draft_vocab_size") or data["vocab_size"],
            layer_ids=tuple(layer_ids),
        )


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.float().pow(2).mean(-1, keepdim=True)
        return self.weight * (x.float() * torch.rsqrt(variance + self.eps)).to(x.dtype)


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class Attention(nn.Module):
    """Grouped-query attention whose queries, keys and values read the 2H-wide concatenated input."""

    def __init__(self, config: Eagle3Config) -> None:
        super().__init__()
        width = 2 * config.hidden_size
        self.heads, self.kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        self.q_proj = nn.Linear(width, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(width, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(width, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, config.hidden_size, bias=False)

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Rotated queries ``[..., heads, T, d]``, rotated keys and values ``[..., kv_heads, T, d]`` of ``x`` ``[..., T, 2H]``."""
        shape = x.shape[:-1]
        q = self.q_proj(x).view(*shape, self.heads, self.head_dim).transpose(-3, -2)
        k = self.k_proj(x).view(*shape, self.kv_heads, self.head_dim).transpose(-3, -2)
        v = self.v_proj(x).view(*shape, self.kv_heads, self.head_dim).transpose(-3, -2)
        return rotate(q, cos, sin), rotate(k, cos, sin), v

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """Output ``[..., T, H]`` of queries over keys/values (``mask``: boolean, True = may attend)."""
        repeat = self.heads // self.kv_heads
        k, v = k.repeat_interleave(repeat, dim=-3), v.repeat_interleave(repeat, dim=-3)
        out = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.o_proj(out.transpose(-3, -2).flatten(-2))

    def attend_unrolled(
        self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, own_keys: list[torch.Tensor], own_values: list[torch.Tensor], causal: torch.Tensor
    ) -> torch.Tensor:
        """The training-time test's attention, output ``[..., T, H]``: query t over the step-0 entries at bases
        <= t (``keys``/``values`` ``[..., kv_heads, T, d]``, ``causal`` ``[T, T]``) and over its own base's
        later steps (``own_keys``/``own_values``: one ``[..., kv_heads, T, d]`` per step, key t for query t
        only). What :meth:`attend` computes under the mask ``[causal, diagonal, ...]``, without a
        ``T x T(k + 1)`` mask: the own steps' scores are one dot product per query."""
        repeat, scale = self.heads // self.kv_heads, self.head_dim**-0.5
        scores = (q @ keys.repeat_interleave(repeat, dim=-3).transpose(-1, -2)) * scale
        scores = scores.masked_fill(~causal, float("-inf"))
        own_v = [v.repeat_interleave(repeat, dim=-3) for v in own_values]
        own = [(q * k.repeat_interleave(repeat, dim=-3)).sum(-1, keepdim=True) * scale for k in own_keys]
        weights = torch.softmax(torch.cat([scores, *own], dim=-1), dim=-1)
        length = keys.shape[-2]
        out = weights[..., :length] @ values.repeat_interleave(repeat, dim=-3)
        for i, v in enumerate(own_v):
            out = out + weights[..., length + i : length + i + 1] * v
        return self.o_proj(out.to(q.dtype).transpose(-3, -2).flatten(-2))


def rotary(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin ``[..., T, head_dim]`` of Llama's default rotary embedding at ``positions``."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim))
    angles = positions.float()[..., None] * inv_freq
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Apply rotary embeddings to ``x`` ``[..., heads, T, d]`` (cos/sin ``[..., T, d]``)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos.unsqueeze(-3) + rotated * sin.unsqueeze(-3)


class Eagle3Layer(nn.Module):
    """The head's one decoder layer (``midlayer`` in the public layout)."""

    def __init__(self, config: Eagle3Config) -> None:
        super().__init__()
        self.self_attn = Attention(config)
        self.mlp = MLP(config.hidden_size, config.intermediate_size)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.hidden_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def inputs(self, embeds: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
        """The attention's 2H-wide input."""
        return torch.cat((self.input_layernorm(embeds.to(states.dtype)), self.hidden_norm(states)), dim=-1)

    def finish(self, states: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """Residual, post-attention norm and MLP: the layer's pre-norm output state."""
        residual = states + attended
        return residual + self.mlp(self.post_attention_layernorm(residual))


class Eagle3Head(nn.Module):
    """The EAGLE-3 head's weights (without the target's embedding, which it borrows frozen).

    Args:
        config: the head's shape.
        embed_tokens: the target's input embedding.
    """

    def __init__(self, config: Eagle3Config, embed_tokens: nn.Embedding) -> None:
        super().__init__()
        self.config = config
        hidden = config.hidden_size
        self.fc = nn.Linear(3 * hidden, hidden, bias=False)
        self.midlayer = Eagle3Layer(config)
        self.norm = RMSNorm(hidden, config.rms_norm_eps)
        self.lm_head = nn.Linear(hidden, config.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))
        self.embed_tokens = [embed_tokens]  # a list: borrowed, not a registered (saved, trained) submodule

    @property
    def device(self) -> torch.device:
        return self.d2t.device

    @property
    def embedding(self) -> nn.Embedding:
        return self.embed_tokens[0]

    def set_vocabulary(self, target_ids: torch.Tensor) -> None:
        """Use these target token ids (sorted, unique) as the draft vocabulary: fills ``d2t`` and ``t2d``."""
        target_ids = torch.as_tensor(target_ids, dtype=torch.long)
        if target_ids.numel() != self.config.draft_vocab_size or not bool((target_ids[1:] > target_ids[:-1]).all()):
            raise ValueError(f"the draft vocabulary must be {self.config.draft_vocab_size} sorted, unique target ids")
        self.d2t.copy_(target_ids - torch.arange(len(target_ids)))
        self.t2d.zero_()
        self.t2d[target_ids] = True

    @property
    def target_ids(self) -> torch.Tensor:
        """Target id of each draft id."""
        return torch.arange(self.config.draft_vocab_size, device=self.d2t.device) + self.d2t

    def draft_logits(self, states: torch.Tensor) -> torch.Tensor:
        """Logits over the draft vocabulary of pre-norm output states."""
        return self.lm_head(self.norm(states))

    def target_logits(self, states: torch.Tensor) -> torch.Tensor:
        """Logits over the target vocabulary (-inf for tokens outside the draft vocabulary)."""
        draft = self.draft_logits(states)
        full = draft.new_full((*draft.shape[:-1], self.config.vocab_size), float("-inf"))
        full[..., self.target_ids] = draft
        return full

    def unrolled(self, tokens: torch.Tensor, aux: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """Training-time test: ``steps`` draft steps at every position of a batch at once.

        ``tokens`` ``[B, T]`` are the sequence, ``aux`` ``[B, T, 3H]`` the target's states at each position.
        Step 0 at base t reads (token t + 1, fused target state t); step k reads (token t + k + 1, its own
        step-(k-1) state at base t), attending to step-0 entries at bases <= t and to its own earlier steps
        at base t — what the head sees when it drafts k + 1 tokens after position t. Returns each step's
        pre-norm states ``[B, T, H]`` (step k predicts token t + k + 2; positions past the end are padding).
        """
        length = tokens.shape[1]
        attention = self.midlayer.self_attn
        config = self.config
        shifted = torch.nn.functional.pad(tokens[:, 1:], (0, 1))
        positions = torch.arange(length, device=tokens.device)
        causal = positions[None, :] <= positions[:, None]  # [T(query), T(key)]
        states = self.fc(aux)
        own_keys, own_values, outputs = [], [], []
        for step in range(steps):
            embeds = self.embedding(torch.nn.functional.pad(shifted[:, step:], (0, step)))
            cos, sin = rotary(positions + step, config.head_dim, config.rope_theta, states.dtype)
            q, k, v = attention.project(self.midlayer.inputs(embeds, states), cos, sin)
            if step == 0:
                keys, values = k, v
            else:
                own_keys.append(k)
                own_values.append(v)
            states = self.midlayer.finish(states, attention.attend_unrolled(q, keys, values, own_keys, own_values, causal))
            outputs.append(states)
        return outputs


def save_head(head: Eagle3Head, folder: str | Path, metadata: dict | None = None) -> None:
    """Write ``config.json`` and ``model.safetensors`` in the public EAGLE-3 layout (``metadata``: strings
    stored inside the safetensors file, e.g. provenance)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / CONFIG).write_text(json.dumps(head.config.to_json(), indent=1))
    tensors = {name: tensor.detach().contiguous() for name, tensor in head.state_dict().items()}
    save_file(tensors, folder / WEIGHTS, metadata={k: str(v) for k, v in (metadata or {}).items()})


def is_head_folder(folder: str | Path) -> bool:
    """True when ``folder`` holds a head in the EAGLE-3 layout: its config names the target layers it reads, or its
    architecture is an EAGLE-3 head (then :func:`load_head` says what its config lacks)."""
    config = Path(folder) / CONFIG
    if not config.is_file():
        return False
    data = read_json(config, "EAGLE-3 head config")
    return "eagle_config" in data or any("eagle3" in str(name).lower() for name in data.get("architectures") or ())


def load_head(folder: str | Path, target: nn.Module, dtype: torch.dtype | None = None) -> Eagle3Head:
    """Load a head saved in the public EAGLE-3 layout for ``target`` (a transformers causal LM whose input
    embedding it borrows). Unpickles nothing. Checks that the head fits the target."""
    folder = Path(folder)
    if not (folder / CONFIG).is_file() or not (folder / WEIGHTS).is_file():
        raise UnreadableFile(f"{folder} is not an EAGLE-3 head folder ({CONFIG} and {WEIGHTS} expected)")
    config = Eagle3Config.from_json(read_json(folder / CONFIG, "EAGLE-3 head config"), str(folder / CONFIG))
    embedding = target.get_input_embeddings()
    if config.vocab_size != embedding.num_embeddings or config.hidden_size != embedding.embedding_dim:
        raise ValueError(
            f"head {folder} is for a target with vocabulary {config.vocab_size} and width {config.hidden_size}; "
            f"this target has {embedding.num_embeddings} and {embedding.embedding_dim}"
        )
    layers = target.config.num_hidden_layers
    if max(config.layer_ids) >= layers:
        raise ValueError(f"head {folder} reads target layers {list(config.layer_ids)}; the target has {layers}")
    tensors = read_tensors(folder / WEIGHTS, "EAGLE-3 head weights")
    tensors = {name.removeprefix("model."): value for name, value in tensors.items() if not name.endswith("embed_tokens.weight")}
    if "t2d" not in tensors and "d2t" in tensors:
        if tuple(tensors["d2t"].shape) != (config.draft_vocab_size,):
            raise UnreadableFile(f"head {folder}: d2t has shape {tuple(tensors['d2t'].shape)}; {CONFIG}'s draft_vocab_size is {config.draft_vocab_size}")
        t2d = torch.zeros(config.vocab_size, dtype=torch.bool)
        t2d[torch.arange(config.draft_vocab_size) + tensors["d2t"]] = True
        tensors["t2d"] = t2d
    head = Eagle3Head(config, embedding)
    load_weights(head, tensors, folder / WEIGHTS, f"EAGLE-3 head (as its {CONFIG} sizes it)")
    return head.to(dtype or embedding.weight.dtype).eval()
