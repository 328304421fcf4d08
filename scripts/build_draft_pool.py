"""Build the draft-training prompt pool: prompts disjoint from every prompt of the policy workload.

The policy workload (``data/workload/prompts.jsonl``, built by ``build_workload.py``) trains, tunes and
tests draft policies. A draft trained on the same prompts looks better on the policy-training traces than
on val and test, which pulls every tuned policy toward drafts that are too deep. This pool is for drafts
only:

* passages from the workload's sources that the workload does not use, and from more Debian documentation
  packages in the four languages (GIMP help, Debian Edu manual, Debian Handbook, installation guide, KiCad
  help), unpacked with ``dpkg -x``;
* only passages that ``split_of`` assigns to train, so no val or test passage of any source is used, and
  none quoted inside a workload prompt;
* the workload's four task types and instructions, per language, then (appended, so the earlier prompts
  stay as they were) its four copy-heavy ones: fix the typos, comment code, answer from a passage,
  translate keeping names. Their answers copy spans of the prompt, as half of the workload's val and test
  prompts do; a draft that never saw such prompts does not learn to copy;
* then (appended again) more English prompts of every task, up to twice as many per task: the head
  accepts least in English.

Kept out of every split on purpose (independent checks): Debian's manpages, maint-guide, debian-faq and
aptitude documentation.

Run: .venv/bin/python scripts/build_draft_pool.py [--debs DIR] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))
sys.path.insert(0, str(ROOT))

from build_workload import (  # noqa: E402
    COPY_TASK_SOURCES,
    COPY_TOKEN_RANGE,
    INSTRUCTIONS,
    LANGUAGES,
    TOKEN_RANGE,
    collect_sources,
    copy_prompt,
    fetch,
    in_language,
    split_of,
    with_typos,
)

from adaptive.models import cache_root, smollm2_folder  # noqa: E402

PACKAGES = [
    *(f"gimp-help-{lang}" for lang in ("en", "it", "es", "zh-cn")),
    *(f"debian-edu-doc-{lang}" for lang in ("en", "it", "es", "zh-cn")),
    *(f"kicad-doc-{lang}" for lang in ("en", "it", "es", "zh")),
    "installation-guide-amd64",
    "debian-handbook",
]
HTML_FOLDERS = {
    "gimp-help": {"en": "gimp/2.0/help/en", "it": "gimp/2.0/help/it", "es": "gimp/2.0/help/es", "zh": "gimp/2.0/help/zh_CN"},
    "debian-handbook": {lang: f"doc/debian-handbook/html/{code}" for lang, code in (("en", "en-US"), ("it", "it-IT"), ("es", "es-ES"), ("zh", "zh-CN"))},
    "installation-guide": {lang: f"doc/installation-guide-amd64/{code}" for lang, code in (("en", "en"), ("it", "it"), ("es", "es"), ("zh", "zh_CN"))},
    "kicad-doc": {lang: f"doc/kicad/help/{lang}" for lang in LANGUAGES},
    "debian-edu-doc": {lang: f"doc/debian-edu-doc-{code}" for lang, code in (("en", "en"), ("it", "it"), ("es", "es"), ("zh", "zh-cn"))},
}
EXCLUDED = ("manpages", "maint-guide", "debian-faq", "aptitude")
GENERIC_CODE = {
    "en": "Explain what this code does:\n\n```\n{text}\n```",
    "it": "Spiega cosa fa questo codice:\n\n```\n{text}\n```",
    "es": "Explica qué hace este código:\n\n```\n{text}\n```",
    "zh": "请解释这段代码的作用：\n\n```\n{text}\n```",
}
PER_TASK = 1600  # per language and task: 4 x 4 x 1600 = 25,600 prompts at most
COPY_PER_TASK = 300  # per language and copy-heavy task: 4 x 4 x 300 = 4,800 prompts at most
MORE_ENGLISH = 2
"""English, where the head accepts least, gets up to twice as many prompts per task: the ones beyond the
first PER_TASK / COPY_PER_TASK are appended after every earlier prompt (2026-12-02), the rest unchanged."""


class BlockText(HTMLParser):
    """Text of an HTML page's headings, paragraphs and preformatted blocks."""

    BLOCKS = {"p", "h1", "h2", "h3", "h4", "pre", "li", "dd"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.blocks: list[tuple[str, str]] = []
        self._kind: str | None = None
        self._parts: list[str] = []

    def _flush(self) -> None:
        if self._kind is not None:
            text = "".join(self._parts)
            text = text.strip("\n") if self._kind == "pre" else re.sub(r"\s+", " ", text).strip()
            if text:
                self.blocks.append((self._kind, text))
        self._kind, self._parts = None, []

    def handle_starttag(self, tag, attrs) -> None:
        para = tag == "div" and ("class", "para") in attrs
        if tag in self.BLOCKS or para:
            self._flush()
            self._kind = "p" if para or tag in ("li", "dd") else tag

    def handle_endtag(self, tag) -> None:
        if tag in self.BLOCKS or tag == "div":
            self._flush()

    def handle_data(self, data) -> None:
        if self._kind is not None:
            self._parts.append(data)


def html_passages(root: Path) -> dict[str, dict[str, list[tuple[str, str]]]]:
    """Per language: headings, paragraphs and code blocks of the extra documentation packages."""
    out: dict[str, dict[str, list[tuple[str, str]]]] = {lang: {"heading": [], "paragraph": [], "code": []} for lang in LANGUAGES}
    for source, folders in HTML_FOLDERS.items():
        for lang, folder in folders.items():
            pages = sorted((root / "usr/share" / folder).rglob("*.html"))
            if source == "debian-edu-doc":
                pages = [p for p in pages if "bookworm" in p.name]  # the bullseye manual repeats it
            for page in pages:
                parser = BlockText()
                parser.feed(page.read_text(encoding="utf-8", errors="replace"))
                for kind, text in parser.blocks:
                    if kind == "pre":
                        out[lang]["code"].append((source, text))
                    elif kind.startswith("h"):
                        out[lang]["heading"].append((source, re.sub(r"^[\d.]+\s+", "", text)))
                    elif text.endswith((".", ":", "。", "：", "!", "?", "！", "？")):
                        out[lang]["paragraph"].append((source, text))
    return out


def cap(lang: str, per_task: int) -> int:
    """Prompts per task in ``lang``."""
    return per_task * (MORE_ENGLISH if lang == "en" else 1)


def build_pool(workload: list[dict], extra, base, tokenizer, seed: int = 20261130) -> list[dict]:
    """Prompts per (language, task) from train-bucket passages that no workload prompt uses."""
    rng = random.Random(seed)
    workload_prompts = [p["prompt"] for p in workload]
    held_out = [p["prompt"] for p in workload if p["split"] != "train"]
    pool, seen = [], set(workload_prompts)
    for lang in LANGUAGES:
        kinds = {
            "question": base[lang]["heading"] + extra[lang]["heading"],
            "continuation": base[lang]["paragraph"] + extra[lang]["paragraph"] + base[lang].get("prose", []),
            "code": [(s, t) for s, t in base[lang]["code"]] + extra[lang]["code"],
            "translation": base[lang]["saying"] + extra[lang]["paragraph"],
        }
        for task, candidates in kinds.items():
            low, high = TOKEN_RANGE[task]
            candidates = list(dict.fromkeys(candidates))
            rng.shuffle(candidates)
            chosen = 0
            for source, text in candidates:
                if chosen == cap(lang, PER_TASK):
                    break
                if split_of(text) != "train" or any(x in source for x in EXCLUDED):
                    continue
                if task != "code" and not in_language(text, lang):
                    continue
                template = INSTRUCTIONS[task][lang] if not (task == "code" and source != "python3.11-doc") else GENERIC_CODE[lang]
                prompt = template.format(text=text)
                if prompt in seen or not low <= len(tokenizer(text)["input_ids"]) <= high:
                    continue
                if len(text) > 40 and any(text in other for other in held_out):
                    continue
                seen.add(prompt)
                pool.append({"id": f"draft-{lang}-{task}-{chosen:04d}", "lang": lang, "task": task, "split": "draft", "source": source, "prompt": prompt})
                chosen += 1
    return pool


def build_copy_pool(workload: list[dict], extra, base, tokenizer, earlier: list[dict], seed: int = 20261201) -> list[dict]:
    """Copy-heavy prompts per (language, task), the workload's instructions, from train-bucket passages that
    no workload prompt quotes (nor its typo'd form) and that quote no val/test passage."""
    rng = random.Random(seed)
    workload_prompts = [p["prompt"] for p in workload]
    held_out = [p["prompt"].split(":", 1)[-1].strip() for p in workload if p["split"] != "train"]
    held_out = [text for text in held_out if len(text) > 40]
    pool, seen = [], {p["prompt"] for p in earlier} | set(workload_prompts)
    for lang in LANGUAGES:
        kinds = {"paragraph": base[lang]["paragraph"] + extra[lang]["paragraph"], "code": base[lang]["code"]}  # Python examples: "comment" asks for Python
        for task, kind in COPY_TASK_SOURCES.items():
            low, high = COPY_TOKEN_RANGE[task]
            candidates = list(dict.fromkeys(kinds[kind]))
            rng.shuffle(candidates)
            chosen = 0
            for source, text in candidates:
                if chosen == cap(lang, COPY_PER_TASK):
                    break
                if split_of(text) != "train" or any(x in source for x in EXCLUDED) or (kind != "code" and not in_language(text, lang)):
                    continue
                prompt = copy_prompt(task, lang, text)
                if prompt is None or prompt in seen or not low <= len(tokenizer(text)["input_ids"]) <= high:
                    continue
                typod = with_typos(text, lang)
                if any(text in other or typod in other for other in workload_prompts) or any(h in prompt for h in held_out):
                    continue
                seen.add(prompt)
                pool.append({"id": f"draft-{lang}-{task}-{chosen:04d}", "lang": lang, "task": task, "split": "draft", "source": source, "prompt": prompt})
                chosen += 1
    return pool


def is_extension(prompt: dict) -> bool:
    """Whether a prompt is one of English's extra ones, beyond the first PER_TASK / COPY_PER_TASK of its task."""
    index = int(prompt["id"].rsplit("-", 1)[1])
    return index >= (COPY_PER_TASK if prompt["task"] in COPY_TASK_SOURCES else PER_TASK)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--debs", type=Path, default=cache_root() / "debs", help="the workload's .deb files")
    parser.add_argument("--extra-debs", type=Path, default=cache_root() / "debs-draft", help="the extra documentation .deb files")
    parser.add_argument("--workload", type=Path, default=ROOT.parent / "data" / "workload" / "prompts.jsonl")
    parser.add_argument("--out", type=Path, default=ROOT.parent / "data" / "workload" / "draft-prompts.jsonl")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_folder())
    workload = [json.loads(line) for line in args.workload.read_text().splitlines()]
    extra, base = html_passages(fetch(args.extra_debs, PACKAGES)), collect_sources(fetch(args.debs))
    general = build_pool(workload, extra, base, tokenizer)
    copy_heavy = build_copy_pool(workload, extra, base, tokenizer, general)
    pool = sorted([*general, *copy_heavy], key=is_extension)  # stable: the earlier prompts keep their places, the extension last
    args.out.write_text("".join(json.dumps(p, ensure_ascii=False) + "\n" for p in pool))
    counts = Counter((p["lang"], p["task"]) for p in pool)
    for lang in LANGUAGES:
        print(lang, {task: counts[(lang, task)] for task in [*INSTRUCTIONS, *COPY_TASK_SOURCES]})
    print(f"wrote {len(pool)} draft-training prompts to {args.out}")


if __name__ == "__main__":
    main()
