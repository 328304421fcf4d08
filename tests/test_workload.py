"""The shipped multilingual workload: coverage, splits, and what distillation may read."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from adaptive.workload import COPY_TASKS, LANGUAGES, SPLITS, TASKS, WORKLOAD, load_prompts
from lab.distill_data import POOL


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


def test_the_draft_training_pool_is_disjoint_from_every_policy_prompt(prompts):
    """The draft learns from its own prompts: none is a workload prompt (train, val or test), none quotes a
    val/test passage, none comes from the documentation kept out for independent checks; all four languages."""
    pool = [json.loads(line) for line in POOL.read_text().splitlines()]
    assert len(pool) >= 20_000 and {p["lang"] for p in pool} == set(LANGUAGES) and all(p["split"] == "draft" for p in pool)
    assert not {p["prompt"] for p in pool} & {p["prompt"] for p in prompts}
    assert not [p["source"] for p in pool if any(kept in p["source"] for kept in ("manpages", "maint-guide", "debian-faq", "aptitude"))]
    held_out_passages = {p["prompt"].split(":", 1)[-1].strip() for p in prompts if p["split"] != "train"}
    long_passages = [text for text in held_out_passages if len(text) > 40]
    quoting = [p["id"] for p in pool[::50] if any(text in p["prompt"] for text in long_passages)]
    assert not quoting, quoting[:5]
    copy_heavy = [p for p in pool if p["task"] in COPY_TASKS]
    quoting = [p["id"] for p in copy_heavy[::10] if any(text in p["prompt"] for text in long_passages)]
    assert not quoting, quoting[:5]


def test_the_draft_training_pool_holds_copy_heavy_prompts_after_the_rest():
    """Half of the workload's val and test prompts are copy-heavy: the pool has those tasks too, in every
    language, appended after the four first task types (whose shards were generated first); then English's
    extra prompts of every task (numbered past each task's first 1,600 / 300), appended after both."""
    pool = [json.loads(line) for line in POOL.read_text().splitlines()]
    extension = [int(row["id"].rsplit("-", 1)[1]) >= (300 if row["task"] in COPY_TASKS else 1600) for row in pool]
    first_extra = extension.index(True)
    assert all(extension[first_extra:]) and {row["lang"] for row in pool[first_extra:]} == {"en"}
    assert {row["task"] for row in pool[first_extra:]} >= set(COPY_TASKS)
    first_copy = next(i for i, row in enumerate(pool) if row["task"] in COPY_TASKS)
    assert first_copy >= 20_000 and all(row["task"] in COPY_TASKS for row in pool[first_copy:first_extra])
    counts = Counter((p["lang"], p["task"]) for p in pool[first_copy:first_extra])
    assert all(counts[(lang, task)] >= 200 for lang in LANGUAGES for task in COPY_TASKS), counts


def test_copy_heavy_tasks_cover_every_language_and_split_and_come_after_the_rest(prompts):
    rows = [json.loads(line) for line in WORKLOAD.read_text(encoding="utf-8").splitlines()]
    first_copy = next(i for i, row in enumerate(rows) if row["task"] in COPY_TASKS)
    assert all(row["task"] in COPY_TASKS for row in rows[first_copy:])  # appended: earlier selections stay as they were
    counts = Counter((p["lang"], p["task"]) for p in prompts if p["task"] in COPY_TASKS)
    assert all(counts[(lang, task)] >= 30 for lang in LANGUAGES for task in COPY_TASKS), counts
    held_out = Counter((p["lang"], p["split"]) for p in prompts if p["task"] in COPY_TASKS and p["split"] != "train")
    assert all(held_out[(lang, split)] >= 20 for lang in LANGUAGES for split in ("val", "test")), held_out
    named = [p for p in prompts if p["task"] == "passage"]
    assert all(p["prompt"].count(p["prompt"].rsplit('"', 2)[-2]) >= 2 for p in named)  # the term asked about is in the passage


def test_selections_of_several_task_types_take_turns():
    from lab.recording import select_prompts

    chosen = select_prompts("test", per_language=4, tasks=COPY_TASKS)
    assert Counter((p["lang"], p["task"]) for p in chosen) == Counter({(lang, task): 1 for lang in LANGUAGES for task in COPY_TASKS})


def test_interleaved_tasks_take_turns_in_each_language_in_the_given_order():
    from adaptive.workload import interleave_tasks

    rows = [{"lang": lang, "task": task, "n": n} for lang in ("it", "en") for task in ("question", "fix") for n in range(2)]
    assert [(r["task"], r["n"]) for r in interleave_tasks(rows) if r["lang"] == "it"] == [("question", 0), ("fix", 0), ("question", 1), ("fix", 1)]
    ordered = [(r["task"], r["n"]) for r in interleave_tasks(rows, ("fix", "question")) if r["lang"] == "en"]
    assert ordered == [("fix", 0), ("question", 0), ("fix", 1), ("question", 1)]
