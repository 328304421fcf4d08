"""The shipped multilingual workload: coverage, splits, and what distillation may read."""

from __future__ import annotations

from collections import Counter

import pytest

from adaptive.workload import LANGUAGES, SPLITS, TASKS, load_prompts


@pytest.fixture(scope="module")
def prompts():
    return [p for split in SPLITS for p in load_prompts(split)]


def test_at_least_200_prompts_per_language_with_every_task(prompts):
    per_language = Counter(p["lang"] for p in prompts)
    assert all(per_language[lang] >= 200 for lang in LANGUAGES), per_language
    assert {(p["lang"], p["task"]) for p in prompts} == {(lang, task) for lang in LANGUAGES for task in TASKS}


def test_every_language_has_test_and_val_prompts(prompts):
    counts = Counter((p["lang"], p["split"]) for p in prompts)
    assert all(counts[(lang, split)] >= 30 for lang in LANGUAGES for split in SPLITS), counts


def test_splits_are_disjoint_and_ids_unique(prompts):
    assert len({p["id"] for p in prompts}) == len(prompts)
    by_split = {split: {p["prompt"] for p in prompts if p["split"] == split} for split in SPLITS}
    assert not (by_split["test"] & by_split["train"]) and not (by_split["test"] & by_split["val"])


def test_request_lengths_are_comparable_across_languages(prompts):
    for task in TASKS:
        medians = []
        for lang in LANGUAGES:
            lengths = sorted(p["prompt_tokens"] for p in prompts if p["task"] == task and p["lang"] == lang)
            medians.append(lengths[len(lengths) // 2])
        assert max(medians) <= 2.0 * min(medians), (task, medians)


def test_every_prompt_names_its_source_and_licence(prompts):
    assert all(p["source"] and p["licence"] and "\x1b" not in p["prompt"] for p in prompts)


def test_bad_filters_are_named():
    with pytest.raises(ValueError, match="split must be one of"):
        load_prompts("dev")
    with pytest.raises(ValueError, match="lang must be one of"):
        load_prompts("test", lang="fr")
