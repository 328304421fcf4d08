"""General-chat requests for the draft-training pool, in all four languages (``adaptive chat-prompts``).

No chat data set lives on this machine. Two sources, one file:

* **Expanded hand-written seeds**, every language: each request template × topic × modifier of
  :data:`lab.chat_seeds.REQUESTS` (16 kinds of request: stories, poems, advice, explanations, summaries,
  how-tos, emails, recipes, opinions, plans, lists, facts, then programming, code, software and long
  instructions), 5,760 per language; written first, deterministically.
* **English turns the target writes itself**, as Magpie does: the chat template up to the user's turn and a
  hand-written opening (:data:`lab.chat_seeds.OPENINGS`), then the target samples the rest of the turn
  until it ends it (T = 0.9, top-50, on the lean engine: :mod:`lab.batched_sampling`). The target's own
  Italian, Spanish and Chinese turns came out as noise and are not used. Turns that do not end, read as noise
  (low mean log-probability), are not English, repeat themselves, quote a val or test prompt of the policy
  workload, or nearly duplicate any earlier request (MinHash over word or character 3-grams) are dropped.

Nothing in the file is near a held-out chat prompt (``data/workload/chat-test-prompts.jsonl``). Resumable: turns
are appended as they are kept; a rerun reads the file back (counts and duplicate index) and goes on. Run it in
the background: ``nohup .venv/bin/adaptive chat-prompts &``.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import random
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from adaptive.lean import LeanLlama
from lab.background import yield_to_measurements
from lab.batched_sampling import continue_many
from lab.chat_seeds import MODIFIERS, OPENINGS, REQUESTS
from lab.text_language import CJK, in_language

log = logging.getLogger(__name__)

MAGPIE = "target-magpie"
"""The source of the turns the target writes itself."""
MINHASH_PERMUTATIONS, MINHASH_BANDS = 32, 8
TEMPERATURE, TOP_K = 0.9, 50
"""How user turns are sampled: a 135M model at T = 1 over its whole vocabulary writes mostly noise outside English."""
MIN_LOG_PROB = -2.5
"""Turns whose mean log-probability per token (under the sampling distribution) falls below this read as noise
(invented words, language switches) and are dropped."""
NEAR_DUPLICATE = 0.7
"""Estimated Jaccard similarity of 3-gram sets at or above which a turn counts as a near duplicate."""
_PRIME = (1 << 61) - 1


def shingles(text: str) -> set[str]:
    """Word 3-grams (character 3-grams for Chinese) of a normalised text."""
    text = re.sub(r"\s+", " ", text.lower()).strip()
    if CJK.search(text):
        chars = re.sub(r"\s", "", text)
        return {chars[i : i + 3] for i in range(max(1, len(chars) - 2))}
    words = re.findall(r"\w+", text)
    return {" ".join(words[i : i + 3]) for i in range(max(1, len(words) - 2))}


@dataclass
class NearDuplicates:
    """A MinHash index with banded lookup: has a text (nearly) been seen, and remember it."""

    seed: int = 0
    _buckets: list[dict[tuple, list[int]]] = field(default_factory=lambda: [{} for _ in range(MINHASH_BANDS)])
    _signatures: list[np.ndarray] = field(default_factory=list)

    def __post_init__(self) -> None:
        rng = np.random.default_rng(self.seed)
        self._a = rng.integers(1, _PRIME, MINHASH_PERMUTATIONS, dtype=np.uint64).astype(object)
        self._b = rng.integers(0, _PRIME, MINHASH_PERMUTATIONS, dtype=np.uint64).astype(object)

    def signature(self, text: str) -> np.ndarray:
        values = [int.from_bytes(hashlib.blake2b(s.encode(), digest_size=8).digest(), "little") for s in shingles(text)]
        return np.array([min((a * v + b) % _PRIME for v in values) for a, b in zip(self._a, self._b)], dtype=object)

    def _lookup(self, text: str) -> tuple[np.ndarray, list[tuple], bool]:
        signature = self.signature(text)
        rows = MINHASH_PERMUTATIONS // MINHASH_BANDS
        keys = [tuple(signature[band * rows : (band + 1) * rows]) for band in range(MINHASH_BANDS)]
        candidates = {index for band, key in enumerate(keys) for index in self._buckets[band].get(key, [])}
        return signature, keys, any(np.mean(self._signatures[index] == signature) >= NEAR_DUPLICATE for index in candidates)

    def similar(self, text: str) -> bool:
        """Whether a remembered text is a near duplicate of ``text``."""
        return self._lookup(text)[2]

    def add_if_new(self, text: str) -> bool:
        """True (and the text is remembered) unless a remembered text is a near duplicate of it."""
        signature, keys, seen = self._lookup(text)
        if seen:
            return False
        for band, key in enumerate(keys):
            self._buckets[band].setdefault(key, []).append(len(self._signatures))
        self._signatures.append(signature)
        return True


def turn_prefix(tokenizer, opening: str) -> list[int]:
    """The chat template up to and including the user's opening words, the user turn left open."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": opening}], tokenize=False)
    end = text.rindex(tokenizer.eos_token)
    return tokenizer(text[:end], add_special_tokens=False)["input_ids"]


def repeats_itself(text: str) -> bool:
    """A degenerate turn: some 3-gram occurs four or more times."""
    grams = Counter(shingles(text)) if CJK.search(text) else Counter(_word_trigrams(text))
    return bool(grams) and max(grams.values()) >= 4


def _word_trigrams(text: str) -> list[str]:
    words = re.findall(r"\w+", text.lower())
    return [" ".join(words[i : i + 3]) for i in range(len(words) - 2)]


def acceptable(turn: str, lang: str, tokens: int, held_out: list[str]) -> bool:
    """A whole, plausible request in ``lang`` that quotes no held-out prompt."""
    if not 6 <= tokens <= 160 or "<|im_start|>" in turn or repeats_itself(turn):
        return False
    if not in_language(turn, lang):
        return False
    return not any(text in turn for text in held_out)


def expanded_requests(avoid: NearDuplicates, seed: int = 0) -> list[dict]:
    """Every template × topic × modifier of :data:`~lab.chat_seeds.REQUESTS`, per language, shuffled; none near a
    text ``avoid`` holds (the held-out chat prompts)."""
    rows = []
    for lang, kinds in REQUESTS.items():
        made = []
        for kind, (templates, topics) in kinds.items():
            for number, (template, topic, modifier) in enumerate(itertools.product(templates, topics, MODIFIERS[lang])):
                prompt = template.replace("{x}", topic) + modifier
                if avoid.similar(prompt):
                    continue
                made.append(
                    {
                        "id": f"chat-{lang}-{kind}-{number:04d}",
                        "lang": lang,
                        "task": kind,
                        "split": "draft",
                        "source": "hand-written-templates",
                        "prompt": prompt,
                    }
                )
        random.Random(f"{seed}-{lang}").shuffle(made)
        rows.extend(made)
    return rows


def write_chat_prompts(
    engine: LeanLlama,
    tokenizer,
    out: Path,
    *,
    magpie: int,
    held_out: list[str],
    avoid: list[str],
    batch_size: int = 64,
    chunk: int = 512,
    max_new_tokens: int = 96,
    temperature: float = TEMPERATURE,
    top_k: int = TOP_K,
    seed: int = 0,
) -> None:
    """Write the expanded requests to ``out`` (once), then append English turns the target writes itself until
    ``magpie`` of them are kept (see the module docstring)."""
    index = NearDuplicates(seed)
    for text in avoid:
        index.add_if_new(text)
    if not out.exists():
        rows = expanded_requests(index, seed)
        out.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
        log.info("chat prompts: %d expanded requests written to %s", len(rows), out)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    for row in rows:
        index.add_if_new(row["prompt"])
    per_kind = Counter(row["task"] for row in rows if row["source"] == MAGPIE)  # numbering each kind's ids
    made = sum(per_kind.values())
    rng = random.Random(f"{seed}-{made}")
    generator = torch.Generator().manual_seed(rng.randrange(1 << 31))
    eos = tokenizer.eos_token_id
    bar = tqdm(total=magpie, initial=min(made, magpie), desc="English turns by the target", unit="turn", mininterval=30)
    attempts = 0
    with out.open("a") as sink:
        while made < magpie:
            batch, pending = [], Counter()
            for _ in range(chunk):
                kind = min(OPENINGS, key=lambda k: (per_kind[k] + pending[k], rng.random()))  # kinds stay balanced
                pending[kind] += 1
                batch.append((kind, rng.choice(OPENINGS[kind])))
            encoded = [turn_prefix(tokenizer, opening) for _, opening in batch]
            results = continue_many(
                engine,
                encoded,
                max_new_tokens=max_new_tokens,
                eos=eos,
                batch_size=batch_size,
                temperature=temperature,
                top_k=top_k,
                generator=generator,
                between_steps=yield_to_measurements,
            )
            for i, output, score in results:
                attempts += 1
                (kind, opening), prefix = batch[i], encoded[i]
                if output[-1] != eos or score < MIN_LOG_PROB or made >= magpie:
                    continue
                turn = (opening + tokenizer.decode(output[:-1])).strip()
                if not acceptable(turn, "en", len(prefix) + len(output), held_out) or not index.add_if_new(turn):
                    continue
                row = {"id": f"chat-en-{kind}-m{per_kind[kind]:05d}", "lang": "en", "task": kind, "split": "draft", "source": MAGPIE}
                sink.write(json.dumps({**row, "opening": opening, "prompt": turn}, ensure_ascii=False) + "\n")
                per_kind[kind] += 1
                made += 1
                bar.update(1)
            sink.flush()
            log.info("chat prompts: %d English turns kept of %d tried this run", made, attempts)
    bar.close()


def diversity(rows: list[dict]) -> dict[tuple[str, str], dict[str, float]]:
    """Per language and source: requests, mean length in characters, and distinct word (characters for Chinese)
    1-grams and 2-grams over all of them (1.0: no n-gram repeats anywhere)."""
    report = {}
    for lang, source in sorted({(row["lang"], row["source"]) for row in rows}):
        texts = [row["prompt"] for row in rows if row["lang"] == lang and row["source"] == source]
        units = [list(re.sub(r"\s", "", t)) if lang == "zh" else re.findall(r"\w+", t.lower()) for t in texts]
        unigrams = [u for text in units for u in text]
        bigrams = [tuple(text[i : i + 2]) for text in units for i in range(len(text) - 1)]
        report[(lang, source)] = {
            "requests": len(texts),
            "mean_chars": float(np.mean([len(t) for t in texts])),
            "distinct_1": len(set(unigrams)) / max(1, len(unigrams)),
            "distinct_2": len(set(bigrams)) / max(1, len(bigrams)),
        }
    return report
