"""Which of the project's languages a text is written in (a cheap check for building prompt pools)."""

from __future__ import annotations

import re

STOPWORDS = {
    "en": {"the", "of", "and", "to", "is", "in", "you", "that", "it", "with"},
    "it": {"il", "di", "che", "la", "e", "per", "un", "una", "non", "della", "è", "gli"},
    "es": {"el", "de", "que", "la", "y", "los", "las", "por", "un", "una", "se", "del"},
}
CJK = re.compile(r"[\u4e00-\u9fff]")


def in_language(text: str, lang: str) -> bool:
    """True unless the text is plainly in another language (untranslated pages of translated manuals)."""
    cjk = len(CJK.findall(text))
    if lang == "zh":
        return cjk >= 0.2 * len(re.sub(r"\s", "", text))
    if cjk:
        return False
    words = re.findall(r"[a-zàèéìíòóùúñü]+", text.lower())
    hits = {other: sum(w in stop for w in words) for other, stop in STOPWORDS.items()}
    return max(hits.values()) == 0 or hits[lang] == max(hits.values())
