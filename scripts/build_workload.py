"""Build the multilingual prompt workload and the distillation corpus from Debian packages, offline.

Sources (downloaded with `apt-get download`, unpacked with `dpkg -x`, never installed): fortunes,
fortunes-min, fortunes-it, fortunes-es, fortunes-zh, debian-reference-{en,it,es,zh-cn}, python3.11-doc.
Offensive fortune sets (es/off, and the en/it sets listed in SKIPPED_FORTUNES) are skipped; ANSI colour
codes are stripped.

Every source passage is assigned to train / val / test by a hash of its text, so a passage (and anything
made from it) lives in one split only. Prompts: four task types per language (question, continuation,
code, translation), then four copy-heavy ones whose answers copy spans of the prompt (fix the typos in a
passage, comment a piece of code, answer from a passage, translate keeping commands and names), appended
after them with a generator of their own so the first four are unchanged; instructions are written in the
prompt's language. Copy-heavy prompts use passages no earlier prompt and no draft-training prompt
(``draft-prompts.jsonl``) contains. The corpus for distillation holds train-split passages only.

Run: .venv/bin/python scripts/build_workload.py [--debs DIR] [--corpus PATH]
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import random
import re
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from adaptive.models import cache_root, smollm2_folder  # noqa: E402
from adaptive.workload import LANGUAGES, chat_ids  # noqa: E402
from lab.text_language import CJK, in_language  # noqa: E402

PACKAGES = [
    "fortunes",
    "fortunes-min",
    "fortunes-it",
    "fortunes-es",
    "fortunes-zh",
    "debian-reference-en",
    "debian-reference-it",
    "debian-reference-es",
    "debian-reference-zh-cn",
    "python3.11-doc",
]
EN_FORTUNES = [
    "fortunes",
    "literature",
    "riddles",
    "computers",
    "science",
    "wisdom",
    "work",
    "people",
    "education",
    "humorists",
    "platitudes",
    "pets",
    "food",
    "tao",
    "goedel",
    "linux",
    "debian",
    "art",
    "paradoxum",
    "pratchett",
    "songs-poems",
    "sports",
    "startrek",
]
SKIPPED_FORTUNES = ["en: drugs, ethnic, men-women, politics, law, kids, cookie and the rest not listed", "it: luttazzi", "es: off/*"]
ZH_FORTUNES = ["chinese", "tang300", "song100"]
REFERENCE_LANG = {"it": "it", "en": "en", "zh": "zh-cn", "es": "es"}
LICENCES = {
    "fortunes": "fortune-mod data: BSD-4-clause / public domain quotations (see /usr/share/doc/fortunes*/copyright)",
    "debian-reference": "Debian Reference (Osamu Aoki): GPL-2+ (see /usr/share/doc/debian-reference-*/copyright)",
    "python-doc": "Python documentation: PSF License Version 2 (see /usr/share/doc/python3.11/copyright)",
}

INSTRUCTIONS = {
    "question": {
        "en": "Explain briefly: {text}",
        "it": "Spiega brevemente: {text}",
        "es": "Explica brevemente: {text}",
        "zh": "请简要解释：{text}",
    },
    "continuation": {
        "en": "Continue the following text:\n\n{text}",
        "it": "Continua il testo seguente:\n\n{text}",
        "es": "Continúa el siguiente texto:\n\n{text}",
        "zh": "请续写下面的文字：\n\n{text}",
    },
    "code": {
        "en": "Explain what this Python code does:\n\n```python\n{text}\n```",
        "it": "Spiega cosa fa questo codice Python:\n\n```python\n{text}\n```",
        "es": "Explica qué hace este código Python:\n\n```python\n{text}\n```",
        "zh": "请解释这段 Python 代码的作用：\n\n```python\n{text}\n```",
    },
    "translation": {
        "en": "Translate into Spanish:\n\n{text}",
        "it": "Traduci in inglese:\n\n{text}",
        "es": "Traduce al inglés:\n\n{text}",
        "zh": "请翻译成英文：\n\n{text}",
    },
}
COPY_INSTRUCTIONS = {
    "fix": {
        "en": "Fix the typos in this text and write it out corrected, changing nothing else:\n\n{text}",
        "it": "Correggi gli errori di battitura in questo testo e riscrivilo corretto, senza cambiare altro:\n\n{text}",
        "es": "Corrige las erratas de este texto y escríbelo corregido, sin cambiar nada más:\n\n{text}",
        "zh": "请改正下面这段文字中的错别字，并写出改正后的全文，其他内容不要改动：\n\n{text}",
    },
    "comment": {
        "en": "Add a short comment to each line of this Python code and write out the whole code:\n\n```python\n{text}\n```",
        "it": "Aggiungi un breve commento a ogni riga di questo codice Python e riscrivi tutto il codice:\n\n```python\n{text}\n```",
        "es": "Añade un comentario breve a cada línea de este código Python y escribe el código completo:\n\n```python\n{text}\n```",
        "zh": "请给这段 Python 代码的每一行加上简短的注释，并写出完整的代码：\n\n```python\n{text}\n```",
    },
    "passage": {
        "en": "Answer using only the passage. Passage: {text}\n\nQuestion: what does the passage say about {term}?",
        "it": "Rispondi usando solo il brano. Brano: {text}\n\nDomanda: che cosa dice il brano a proposito di {term}?",
        "es": "Responde usando solo el pasaje. Pasaje: {text}\n\nPregunta: ¿qué dice el pasaje sobre {term}?",
        "zh": "请只根据下面的段落回答。段落：{text}\n\n问题：这段话关于{term}说了什么？",
    },
    "keep-names": {
        "en": "Translate into Spanish, keeping commands, file names and quoted terms exactly as they are:\n\n{text}",
        "it": "Traduci in inglese, lasciando comandi, nomi di file e termini tra virgolette esattamente come sono:\n\n{text}",
        "es": "Traduce al inglés, dejando los comandos, los nombres de archivo y los términos entre comillas tal como están:\n\n{text}",
        "zh": "请翻译成英文，命令、文件名和引号中的内容保持原样：\n\n{text}",
    },
}
COPY_TASK_SOURCES = {"fix": "paragraph", "comment": "code", "passage": "paragraph", "keep-names": "paragraph"}
COPY_TOKEN_RANGE = {"fix": (30, 100), "comment": (15, 110), "passage": (30, 110), "keep-names": (20, 100)}
COPY_PROMPTS_PER_TASK = 40  # per language: 4 tasks x 40 = 160 prompts
NAMED = re.compile(r'"([^"\n]{2,40})"|\b([a-z][\w.+-]*\(\d\))|(?<![\w/])(/[\w.-]+(?:/[\w.-]+)+)')
"""What a passage names verbatim: a quoted term, a manual-page reference like mount(8), or a file path."""
PROMPTS_PER_TASK = 75  # per language: 4 tasks x 75 = 300 prompts
SPLIT_THRESHOLDS = (("train", 70), ("val", 85), ("test", 100))
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def split_of(text: str) -> str:
    """Deterministic split by a hash of the passage text: 70% train, 15% val, 15% test."""
    bucket = int(hashlib.sha256(text.encode()).hexdigest(), 16) % 100
    return next(name for name, limit in SPLIT_THRESHOLDS if bucket < limit)


def fetch(debs: Path, packages: list[str] = PACKAGES) -> Path:
    """Download (if missing) and unpack ``packages`` into ``debs``; return the unpacked root."""
    debs.mkdir(parents=True, exist_ok=True)
    missing = [p for p in packages if not list(debs.glob(f"{p}_*.deb"))]
    if missing:
        subprocess.run(["apt-get", "download", *missing], cwd=debs, check=True)
    root = debs / "unpacked"
    if not root.exists():
        for deb in sorted(debs.glob("*.deb")):
            subprocess.run(["dpkg", "-x", str(deb), str(root)], check=True)
    return root


def read_text(path: Path) -> str:
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = raw.decode("latin-1")
    return ANSI.sub("", text).replace("\r", "")


def fortunes(path: Path) -> list[str]:
    """Fortune entries without attribution lines."""
    entries = []
    for entry in read_text(path).split("\n%\n"):
        lines = [line.rstrip() for line in entry.strip("\n%").split("\n") if not line.strip().startswith("--")]
        text = "\n".join(lines).strip()
        if text:
            entries.append(text)
    return entries


def reference_parts(root: Path, lang: str) -> tuple[list[str], list[str]]:
    """(section headings, prose paragraphs) of the Debian Reference in one language."""
    text = ANSI.sub("", gzip.decompress((root / f"usr/share/debian-reference/debian-reference.{REFERENCE_LANG[lang]}.txt.gz").read_bytes()).decode("utf-8"))
    headings = sorted({m.group(1).strip() for m in re.finditer(r"^\s+\d+(?:\.\d+)+\.\s+(.+)$", text, re.M)})
    paragraphs = []
    for block in re.split(r"\n\s*\n", text.replace("\xa0", " ")):
        lines = [line for line in block.split("\n") if line.strip()]
        # prose is indented by exactly four spaces; code, tables and the table of contents are not prose
        if len(lines) < 2 or any(not re.match(r"^    \S", line) for line in lines):
            continue
        paragraph = " ".join(line.strip() for line in lines)
        if paragraph.startswith(("|", "+", "$", "#")) or re.match(r"^\d+(\.\d+)*\.\s", paragraph):
            continue
        if paragraph.endswith((".", ":", "。", "：")):
            paragraphs.append(paragraph)
    return headings, paragraphs


def python_examples(root: Path) -> list[str]:
    """Interactive examples (>>> blocks) from the Python documentation sources."""
    blocks = []
    for path in sorted((root / "usr/share/doc/python3.11/html/_sources").rglob("*.rst.txt")):
        for block in re.split(r"\n\s*\n", path.read_text(encoding="utf-8", errors="replace")):
            lines = [line.strip() for line in block.split("\n") if line.strip()]
            if lines and lines[0].startswith(">>> ") and 2 <= len(lines) <= 12:
                blocks.append("\n".join(lines))
    return blocks


def python_prose(root: Path) -> list[str]:
    """Prose paragraphs of the Python tutorial and how-tos (corpus only)."""
    paragraphs = []
    for sub in ("tutorial", "howto", "faq"):
        for path in sorted((root / f"usr/share/doc/python3.11/html/_sources/{sub}").glob("*.rst.txt")):
            for block in re.split(r"\n\s*\n", path.read_text(encoding="utf-8", errors="replace")):
                if block.startswith((" ", ".", "*", "=", "-")):
                    continue
                paragraph = " ".join(line.strip() for line in block.split("\n")).strip()
                if len(paragraph) > 80:
                    paragraphs.append(paragraph)
    return paragraphs


def collect_sources(root: Path) -> dict[str, dict[str, list[tuple[str, str]]]]:
    """Per language, per kind: (source name, text) candidates."""
    games = root / "usr/share/games/fortunes"
    by_lang: dict[str, dict[str, list[tuple[str, str]]]] = {lang: defaultdict(list) for lang in LANGUAGES}
    sayings = {
        "en": [(f"fortunes/{n}", t) for n in EN_FORTUNES for t in fortunes(games / n)],
        "it": [(f"fortunes-it/{p.name}", t) for p in sorted((games / "it").iterdir()) if "." not in p.name and p.name != "luttazzi" for t in fortunes(p)],
        "es": [(f"fortunes-es/{p.stem}", t) for p in sorted((games / "es").glob("*.fortunes")) for t in fortunes(p)],
        "zh": [(f"fortunes-zh/{n}", t) for n in ZH_FORTUNES for t in fortunes(games / n)],
    }
    code = [("python3.11-doc", block) for block in python_examples(root)]
    for lang in LANGUAGES:
        headings, paragraphs = reference_parts(root, lang)
        by_lang[lang]["heading"] = [(f"debian-reference-{REFERENCE_LANG[lang]}", h) for h in headings]
        by_lang[lang]["paragraph"] = [(f"debian-reference-{REFERENCE_LANG[lang]}", p) for p in paragraphs]
        by_lang[lang]["saying"] = sayings[lang]
        by_lang[lang]["code"] = code
    by_lang["en"]["prose"] = [("python3.11-doc", p) for p in python_prose(root)]
    return by_lang


TASK_SOURCES = {"question": "heading", "continuation": "paragraph", "code": "code", "translation": "saying"}
TOKEN_RANGE = {"question": (3, 40), "continuation": (25, 110), "code": (15, 110), "translation": (8, 80)}


def licence_of(source: str) -> str:
    if source.startswith("fortunes"):
        return LICENCES["fortunes"]
    return LICENCES["debian-reference" if source.startswith("debian-reference") else "python-doc"]


def prompt_row(lang: str, task: str, index: int, source: str, text: str, prompt: str, tokenizer) -> dict:
    """A workload row: the prompt made from ``text`` (its passage, which decides the split)."""
    return {
        "id": f"{lang}-{task}-{index:03d}",
        "lang": lang,
        "task": task,
        "split": split_of(text),
        "source": source,
        "licence": licence_of(source),
        "prompt": prompt,
        "prompt_tokens": len(chat_ids(tokenizer, prompt)),
    }


def build_prompts(by_lang, tokenizer, seed: int = 20260923) -> list[dict]:
    """PROMPTS_PER_TASK prompts per (language, task), split by passage hash; code blocks differ per language."""
    rng = random.Random(seed)
    prompts, used_code = [], set()
    for lang in LANGUAGES:
        for task, kind in TASK_SOURCES.items():
            low, high = TOKEN_RANGE[task]
            candidates = [c for c in by_lang[lang][kind] if c[1] not in used_code]
            rng.shuffle(candidates)
            chosen = []
            for source, text in candidates:
                if low <= len(tokenizer(text)["input_ids"]) <= high:
                    chosen.append((source, text))
                if len(chosen) == PROMPTS_PER_TASK:
                    break
            if task == "code":
                used_code.update(text for _, text in chosen)
            for index, (source, text) in enumerate(chosen):
                prompt = INSTRUCTIONS[task][lang].format(text=text)
                prompts.append(prompt_row(lang, task, index, source, text, prompt, tokenizer))
    return prompts


def with_typos(text: str, lang: str) -> str:
    """The passage with deterministic typos (seeded by its text): two neighbouring letters swapped in about
    one word in six (Latin script), or two neighbouring characters in about one place in fifteen (Chinese)."""
    rng = random.Random(hashlib.sha256(text.encode()).hexdigest())
    if lang == "zh":
        chars = list(text)
        for i in range(len(chars) - 1):
            if CJK.match(chars[i]) and CJK.match(chars[i + 1]) and rng.random() < 1 / 15:
                chars[i], chars[i + 1] = chars[i + 1], chars[i]
        return "".join(chars)

    def swap(match: re.Match) -> str:
        word = match.group(0)
        if rng.random() >= 1 / 6:
            return word
        i = rng.randrange(1, len(word) - 2)
        return word[:i] + word[i + 1] + word[i] + word[i + 2 :]

    return re.sub(r"[^\W\d_]{5,}", swap, text)


def copy_prompt(task: str, lang: str, text: str) -> str | None:
    """The copy-heavy prompt of ``task`` made from a passage, or None when the passage does not suit it (a
    question asks about something the passage names verbatim, which a translation must also keep)."""
    template = COPY_INSTRUCTIONS[task][lang]
    if task == "fix":
        typed = with_typos(text, lang)
        return template.format(text=typed) if typed != text else None
    if task in ("passage", "keep-names"):
        named = NAMED.search(text)
        if named is None:
            return None
        return template.format(text=text, term=f'"{next(group for group in named.groups() if group)}"')
    return template.format(text=text)


def passage_of(prompt: str) -> str:
    """The passage inside a prompt of the four first task types (its text without the instruction)."""
    for by_lang in INSTRUCTIONS.values():
        for template in by_lang.values():
            head, tail = template.split("{text}")
            if prompt.startswith(head) and prompt.endswith(tail):
                return prompt[len(head) : len(prompt) - len(tail)]
    return prompt.split("\n\n", 1)[-1].removeprefix("```\n").removesuffix("\n```")  # the pool's generic code prompts


def build_copy_prompts(by_lang, tokenizer, earlier: list[dict], pool: list[str], seed: int = 20261130) -> list[dict]:
    """COPY_PROMPTS_PER_TASK copy-heavy prompts per (language, task), split by passage hash, from passages in
    the prompt's language that no ``earlier`` prompt and no draft-training prompt (``pool``) contains."""
    rng = random.Random(seed)
    used = [p["prompt"] for p in earlier]
    pool_passages = [passage for passage in map(passage_of, pool) if len(passage) > 40]
    prompts = []
    for lang in LANGUAGES:
        pool_lang = [p for p in pool if in_language(p, lang)]
        for task, kind in COPY_TASK_SOURCES.items():
            low, high = COPY_TOKEN_RANGE[task]
            candidates = list(dict.fromkeys(by_lang[lang][kind]))
            rng.shuffle(candidates)
            chosen = []
            for source, text in candidates:
                if len(chosen) == COPY_PROMPTS_PER_TASK:
                    break
                if kind != "code" and not in_language(text, lang):
                    continue
                prompt = copy_prompt(task, lang, text)
                if prompt is None or not low <= len(tokenizer(text)["input_ids"]) <= high:
                    continue
                if any(text in other for other in used) or any(text in other for other in pool_lang):
                    continue
                if any(passage in prompt for passage in pool_passages):  # the pool keeps no passage a workload prompt quotes
                    continue
                used.append(prompt)
                chosen.append((source, text, prompt))
            for index, (source, text, prompt) in enumerate(chosen):
                prompts.append(prompt_row(lang, task, index, source, text, prompt, tokenizer))
    return prompts


def build_corpus(by_lang, prompts: list[dict]) -> list[dict]:
    """Train-split passages of every kind (and train prompts); nothing from val or test."""
    held_out = {p["prompt"] for p in prompts if p["split"] != "train"}
    rows = []
    for lang in LANGUAGES:
        for kind, items in by_lang[lang].items():
            if kind == "code" and lang != "en":
                continue  # one copy of the code examples
            for source, text in items:
                if split_of(text) != "train":
                    continue
                quoted_in_held_out = len(text) > 40 and kind != "heading" and any(text in prompt for prompt in held_out)
                if not quoted_in_held_out:
                    rows.append({"lang": lang, "kind": kind, "source": source, "text": text})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--debs", type=Path, default=cache_root() / "debs", help="where the .deb files are kept")
    parser.add_argument("--out", type=Path, default=ROOT / "data" / "workload" / "prompts.jsonl")
    parser.add_argument("--corpus", type=Path, default=cache_root() / "corpus.jsonl", help="distillation corpus (train split only)")
    parser.add_argument(
        "--pool",
        type=Path,
        default=ROOT / "data" / "workload" / "draft-prompts.jsonl",
        help="draft-training prompts (scripts/build_draft_pool.py), whose passages copy-heavy prompts avoid",
    )
    args = parser.parse_args()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_folder())
    by_lang = collect_sources(fetch(args.debs))
    prompts = build_prompts(by_lang, tokenizer)
    pool_rows = [json.loads(line) for line in args.pool.read_text(encoding="utf-8").splitlines()]
    pool = [row["prompt"] for row in pool_rows if row["task"] in INSTRUCTIONS]  # the prompts the copy-heavy selection was made against
    prompts += build_copy_prompts(by_lang, tokenizer, prompts, pool)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(p, ensure_ascii=False) + "\n" for p in prompts))
    corpus = build_corpus(by_lang, prompts)
    args.corpus.parent.mkdir(parents=True, exist_ok=True)
    args.corpus.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in corpus))
    counts = Counter((p["lang"], p["split"]) for p in prompts)
    for lang in LANGUAGES:
        print(lang, {split: counts[(lang, split)] for split, _ in SPLIT_THRESHOLDS})
    print(f"wrote {len(prompts)} prompts to {args.out} and {len(corpus)} corpus passages to {args.corpus}")


if __name__ == "__main__":
    main()
