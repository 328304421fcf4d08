"""The ``adaptive`` command line, run as a user would (a subprocess of the installed console script)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from adaptive.profile import CostProfile
from lab.cli.commands import COMMANDS
from policies.batch import make_batch_policy

ENGINE_COMMANDS = ("generate", "demo", "profile", "record", "loadtest")


def run(*args: str, engine: str = "eager") -> subprocess.CompletedProcess:
    """The command line as a user runs it; commands that decode run transformers' forward (``engine``) unless a test
    asks for another: compiling a tiny model costs 5-50 s a process, and one test covers the default."""
    chosen = ("--engine", engine) if args[0] in ENGINE_COMMANDS and "--engine" not in args else ()
    return subprocess.run([sys.executable, "-m", "lab.cli", *args, *chosen], capture_output=True, text=True, timeout=300)


def test_exactness_reproduces_the_seed_analysis():
    out = run("exactness").stdout
    assert "| residual | 0.500000 | 0.300000 | 0.200000 | 0.000000 |" in out
    assert "| naive    | 0.350000 | 0.390000 | 0.260000 | 0.150000 |" in out
    assert "200000 trials, seed 20260923" in out
    assert "A 0.00112" in out


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--alpha", "0.7", "--c", "0.05"], "optimal gamma* = 6: E = 3.058819, S = 2.353"),
        (["--alpha", "0.7", "--c", "0.20"], "optimal gamma* = 3: E = 2.533000, S = 1.583"),
        (["--alpha", "0.7", "--c", "0.05", "--g", "3", "--max-gamma", "6"], "optimal gamma* = 6: E = 3.058819, S = 0.927"),
    ],
)
def test_costmodel_reproduces_the_seed_sweep(args, expected):
    assert expected in run("costmodel", *args).stdout


def test_costmodel_bad_alpha_is_a_clear_error():
    result = run("costmodel", "--alpha", "1.5", "--c", "0.1")
    assert result.returncode == 2
    assert "alpha must be in [0, 1], got 1.5" in result.stderr


def test_generate_prints_rounds_and_speedup(model_folders):
    result = run(
        "generate",
        "--target",
        model_folders["target"],
        "--draft",
        model_folders["draft"],
        "--policy",
        "heuristic",
        "--max-new-tokens",
        "20",
        "--compare",
        "the cat sat",
    )
    assert result.returncode == 0, result.stderr
    assert "| round | context | drafted | verified | accepted | emitted |" in result.stdout
    assert "speedup over plain decoding:" in result.stdout
    assert "greedy outputs: identical" in result.stdout
    assert "prompt: the tokenizer's chat template" in result.stdout  # an instruct tokenizer: templated by default
    raw = run("generate", "--target", model_folders["target"], "--draft", model_folders["draft"], "--max-new-tokens", "8", "--raw", "the cat sat")
    assert raw.returncode == 0, raw.stderr
    assert "prompt: as given" in raw.stdout and "the cat sat\n--> " in raw.stdout


def test_generate_decodes_draft_trees_greedy_and_sampled(model_folders):
    """``--tree K,W,V``: greedy trees emit plain decoding's tokens; with a temperature they sample (seeded: the same
    seed, the same text)."""
    pair = ("--target", model_folders["target"], "--draft", model_folders["draft"], "--tree", "2,2,4", "--max-new-tokens", "12")
    greedy = run("generate", *pair, "--compare", "the cat sat")
    assert greedy.returncode == 0, greedy.stderr
    assert "tree k=2 W=2 V=4" in greedy.stdout and "greedy outputs: identical" in greedy.stdout
    sampled = [run("generate", *pair, "--temperature", "0.8", "--seed", "3", "--quiet-rounds", "the cat sat") for _ in range(2)]
    assert all(r.returncode == 0 for r in sampled), sampled[0].stderr
    texts = [r.stdout.split("--> ")[1].split("\n")[0] for r in sampled]
    assert "sampling: T=0.8" in sampled[0].stdout and texts[0] == texts[1]


def test_the_text_stream_prints_each_round_s_new_text_and_holds_back_a_split_character(capsys):
    """A byte-level tokenizer spells a CJK character in three tokens: a round that ends inside it prints nothing of
    it until the round that completes it; the printed pieces add up to the decoded output."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from adaptive.policy import RoundStats
    from lab.cli.decoding import TextStream

    bpe = Tokenizer(models.BPE({c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}, []))
    bpe.pre_tokenizer, bpe.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe)
    ids = tokenizer.encode("a猫b")
    assert len(ids) == 5  # a, three bytes of 猫, b
    stream, printed = TextStream(tokenizer), []
    for piece in (ids[:2], ids[2:3], ids[3:]):
        stream(RoundStats(0, len(piece), len(piece), len(piece) - 1, len(piece), tuple(piece), 0.0, 0.0, 0.0, 0.0))
        printed.append(capsys.readouterr().out)
    stream.finish()
    assert printed == ["a", "", "猫b"] and capsys.readouterr().out == "\n\n"  # the line ends, a blank one follows


@pytest.mark.slow
def test_by_default_a_llama_pair_decodes_on_the_compiled_int4_engine_and_says_so(model_folders):
    """No --engine: auto picks compiled-int4 for a Llama-layout pair on the CPU, says so, and speculation on it emits
    plain decoding's tokens on the same engine."""
    pair = ("--target", model_folders["target"], "--draft", model_folders["draft"])
    result = run("generate", *pair, "--max-new-tokens", "16", "--compare", "the cat", engine="auto")
    assert result.returncode == 0, result.stderr
    assert "engine auto: compiled-int4" in result.stderr and "engine: compiled-int4" in result.stdout
    assert "greedy outputs: identical" in result.stdout


def test_an_eagle3_head_folder_drafts_and_profiles_like_any_draft(model_folders, tmp_path):
    result = run(
        "generate",
        "--target",
        model_folders["target"],
        "--draft",
        model_folders["head"],
        "--policy",
        "static:3",
        "--max-new-tokens",
        "20",
        "--compare",
        "the cat sat on",
    )
    assert result.returncode == 0, result.stderr
    assert "greedy outputs: identical" in result.stdout
    out = tmp_path / "head-profile.json"
    result = run(
        "profile",
        "--target",
        model_folders["target"],
        "--draft",
        model_folders["head"],
        "--out",
        str(out),
        "--max-verify",
        "3",
        "--contexts",
        "8",
        "--reference-context",
        "8",
        "--repetitions",
        "2",
    )
    assert result.returncode == 0, result.stderr
    assert CostProfile.load(out).c > 0


def test_generate_bad_policy_is_a_clear_error(model_folders):
    result = run("generate", "--target", model_folders["target"], "--draft", model_folders["draft"], "--policy", "fast", "x")
    assert result.returncode == 2
    assert "unknown policy 'fast'" in result.stderr


def test_profile_writes_a_profile_and_prints_c_and_g(model_folders, tmp_path):
    out = tmp_path / "profile.json"
    result = run(
        "profile",
        "--target",
        model_folders["target"],
        "--draft",
        model_folders["draft"],
        "--out",
        str(out),
        "--max-verify",
        "4",
        "--contexts",
        "8,16",
        "--reference-context",
        "16",
        "--repetitions",
        "2",
    )
    assert result.returncode == 0, result.stderr
    assert "| gamma | tokens verified | verify ms |" in result.stdout and "c = " in result.stdout
    assert out.is_file()
    check = run("profile", "--check", str(out))
    assert check.returncode == 0 and "like this machine's" in check.stdout, check.stdout + check.stderr
    document = json.loads(out.read_text())
    document["hardware"]["matrix_flags"] = "avx2 amx_bf16"
    out.write_text(json.dumps(document))
    check = run("profile", "--check", str(out))
    assert check.returncode == 1 and "matrix_flags: 'avx2 amx_bf16' there" in check.stdout


def test_a_profile_check_with_speed_times_the_pair_again_and_flags_another_speed(model_folders, tmp_path):
    """--check FILE --speed times the target and draft steps now and compares them with FILE's: within a loose
    tolerance it passes; against a profile whose steps are 1,000 times slower it fails, naming the ratio (a tiny
    model's step time varies several-fold beside other tests, hence the wide factor; one thread each, since two
    threads beside another test worker's stalled a step 48-fold once)."""
    out = tmp_path / "profile.json"
    pair = ["--target", model_folders["target"], "--draft", model_folders["draft"], "--threads", "1"]
    measured = run("profile", *pair, "--out", str(out), "--max-verify", "2", "--contexts", "8,16", "--reference-context", "16", "--repetitions", "2")
    assert measured.returncode == 0, measured.stderr
    same = run("profile", *pair, "--check", str(out), "--speed", "--speed-tolerance", "20", "--repetitions", "3")
    assert same.returncode == 0 and "target step at context 16:" in same.stdout and "within" in same.stdout, same.stdout + same.stderr
    document = json.loads(out.read_text())
    for point in (document["verify"]["16"]["1"], document["draft_step"]["16"]):
        point["median_ms"] *= 1000
    document["target_step_ms"] *= 1000
    out.write_text(json.dumps(document))
    slower = run("profile", *pair, "--check", str(out), "--speed", "--repetitions", "3")
    assert slower.returncode == 1 and "another speed" in slower.stdout, slower.stdout + slower.stderr
    target_ratio = re.search(r"target step at context 16: .* \(([0-9.]+)x\)", slower.stdout)
    assert target_ratio and float(target_ratio.group(1)) < 0.1, slower.stdout
    alone = run("profile", "--speed")
    assert alone.returncode == 2 and "--speed goes with --check FILE" in alone.stderr
    negative = run("profile", "--check", str(out), "--speed", "--speed-tolerance", "-1")
    assert negative.returncode == 2 and "--speed-tolerance must be above 0" in negative.stderr and "got -1.0" in negative.stderr


def test_generate_without_a_pair_is_a_clear_error():
    result = run("generate", "hello")
    assert result.returncode == 2
    assert "give --pair NAME, or both --target PATH and --draft PATH" in result.stderr


def test_the_copy_drafter_decodes_and_profiles_from_the_command_line(model_folders, tmp_path):
    result = run(
        "generate", "--target", model_folders["target"], "--draft", "copy", "--policy", "static:4",
        "--max-new-tokens", "30", "--compare", "the cat sat on the mat and the cat sat on the",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "pair: target" in result.stdout and "+copy" in result.stdout
    assert "greedy outputs: identical" in result.stdout
    out = tmp_path / "copy-profile.json"
    result = run(
        "profile", "--target", model_folders["target"], "--draft", "copy", "--out", str(out),
        "--max-verify", "3", "--contexts", "8", "--reference-context", "8",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert CostProfile.load(out).c > 0


def test_loadtest_compares_plain_and_speculative_batches_under_load(model_folders, tmp_path):
    """Closed-loop clients at concurrency 1 and 2 and Poisson arrivals, plain batched decoding beside two
    batch policies: every greedy request identical to plain, a report, a JSON result and a plot."""
    import json

    out = tmp_path / "load"
    pair = ("--target", model_folders["target"], "--draft", model_folders["draft"])
    common = ("--policy", "static:3", "--policy", "schedule:1-1=4,2-8=2", "--requests", "6", "--max-new-tokens", "12")
    result = run("loadtest", *pair, *common, "--concurrency", "1,2", "--out", str(out))
    assert result.returncode == 0, result.stderr
    data = json.loads((out / "result.json").read_text())
    assert list(data["loads"]) == ["concurrency 1", "concurrency 2"]
    for load in data["loads"].values():
        assert list(load["summary"]) == ["plain", "static:3", "schedule:1-1=4,2-8=2"]
        for entry in load["summary"].values():
            assert entry["divergent_requests"] == 0 and entry["all"]["requests"] == 6
            assert entry["all"]["tpot_ms"]["p50"] <= entry["all"]["tpot_ms"]["p95"] and entry["all"]["throughput"] > 0
        assert load["summary"]["static:3"]["all"]["accepted_per_round"] > 0 == load["summary"]["plain"]["all"]["accepted_per_round"]
        assert all(set(d) == {"3"} for d in load["summary"]["static:3"]["depths"].values())
        assert all(set(d) == {"0"} for d in load["summary"]["plain"]["depths"].values())
    schedule = data["loads"]["concurrency 2"]["summary"]["schedule:1-1=4,2-8=2"]["depths"]  # what it chose at each batch size
    assert set(schedule["2"]) == {"2"} and all(set(d) == {"4"} for b, d in schedule.items() if b == "1")
    assert "### concurrency 2 (6 requests)" in result.stdout and (out / "report.md").is_file() and (out / "load.png").is_file()
    assert not list(out.glob("*.partial.jsonl"))  # the checkpoint of finished loads goes once the result is written
    from lab.loadtest import read_result, summary

    assert "token_ids" not in (out / "result.json").read_text() and (out / "gaps.npz").is_file()  # outputs kept as digests, gaps apart
    back = read_result(out / "result.json")["loads"]["concurrency 2"]
    for name, repeats in back["runs"].items():  # the kept rows and gaps give the summary again
        rows = [row for run in repeats for row in run["rows"]]
        assert len(rows) == 6 * len(repeats) and all(len(row["gaps"]) == row["tokens"] - 1 for row in rows)
        again = summary(rows, sum(run["wall"] for run in repeats), data["settings"]["slo_tpot_ms"])
        assert again["itl_ms"]["p95"] == pytest.approx(back["summary"][name]["all"]["itl_ms"]["p95"], rel=1e-5)
    assert "depth by batch size" in result.stdout and "2:2" in result.stdout
    rated = run("loadtest", *pair, *common, "--rate", "200", "--max-batch", "4", "--interleave", "--out", str(tmp_path / "rate"))
    assert rated.returncode == 0, rated.stderr
    assert "### rate 200/s" in rated.stdout
    interleaved = json.loads((tmp_path / "rate" / "result.json").read_text())  # the policies took rounds in turn
    assert interleaved["settings"]["interleave"] and all(e["divergent_requests"] == 0 for e in interleaved["loads"]["rate 200/s"]["summary"].values())
    neither = run("loadtest", *pair, "--requests", "2")
    assert neither.returncode == 2 and "give --concurrency" in neither.stderr
    bad = run("loadtest", *pair, "--policy", "fast", "--concurrency", "1")
    assert bad.returncode == 2 and "unknown batch policy 'fast'" in bad.stderr


def test_a_load_test_and_a_batched_profile_run_with_an_eagle3_head(model_folders, tmp_path):
    """``--draft HEAD_DIR`` under load: the batched decoder drafts with the head, every greedy request as plain."""
    import json

    pair = ("--target", model_folders["target"], "--draft", model_folders["head"])
    settings = ("--batches", "1,2", "--max-verify", "3", "--reference-context", "8", "--repetitions", "1")
    measured = run("profile", *pair, *settings, "--out", str(tmp_path / "b.json"))
    assert measured.returncode == 0, measured.stderr
    result = run("loadtest", *pair, "--policy", "static:2", "--concurrency", "2", "--requests", "4", "--max-new-tokens", "10", "--out", str(tmp_path / "l"))
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "l" / "result.json").read_text())["loads"]["concurrency 2"]["summary"]
    assert summary["static:2"]["divergent_requests"] == 0 and summary["static:2"]["all"]["requests"] == 4


def test_a_batched_profile_feeds_the_load_aware_baselines(model_folders, tmp_path):
    pair = ("--target", model_folders["target"], "--draft", model_folders["draft"])
    profile = tmp_path / "batch.json"
    measured = run("profile", *pair, "--batches", "1,2", "--max-verify", "4", "--reference-context", "16", "--repetitions", "2", "--out", str(profile))
    assert measured.returncode == 0, measured.stderr
    assert "best depth at alpha 0.5" in measured.stdout and profile.is_file()
    policies = ("--policy", "costmodel", "--policy", "goodput", "--policy", "off-above:1:static:2")
    result = run(
        "loadtest",
        *pair,
        *policies,
        "--batch-profile",
        str(profile),
        "--concurrency",
        "2",
        "--requests",
        "4",
        "--max-new-tokens",
        "8",
        "--max-depth",
        "3",
        "--out",
        str(tmp_path / "l"),
    )
    assert result.returncode == 0, result.stderr
    assert "| costmodel " in result.stdout and "| goodput " in result.stdout and "| off-above:1:static:2 " in result.stdout
    missing = run("loadtest", *pair, "--policy", "goodput", "--concurrency", "1")
    assert missing.returncode == 2 and "needs a batched cost profile" in missing.stderr


def test_train_batch_prints_the_schedule_and_a_capped_spec_that_loads(tmp_path):
    """PPO (short) on the shipped val traces and batched profile: throughput and gap tables per load, the
    schedule of the best static depths, and a ``capped:`` spec that loads as a batch policy."""
    out = tmp_path / "batch"
    args = ("--batch-profile", "profiles/smollm2-135m-batch.json", "--traces", "val", "--loads", "1,8", "--max-depth", "3")
    result = run("train-batch", *args, "--timesteps", "1024", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "inter-token gap p95 in replay" in result.stdout and "| learned, capped |" in result.stdout
    capped = result.stdout.split("never deeper): --policy ")[1].split()[0]
    schedule = result.stdout.split("best static depths: schedule:")[1].split()[0]
    assert capped == f"capped:{schedule}:{out}"
    assert make_batch_policy(capped).name == f"capped:{schedule}:learned-batch:batch"
    assert json.loads((out / "policy.json").read_text())["decision_ms"] == 0.25  # the default charge per decision, kept with the policy
    bad = run("train-batch", *args, "--seeds", "0")
    assert bad.returncode == 2 and "--seeds must be at least 1, got 0" in bad.stderr
    negative = run("train-batch", *args, "--decision-ms", "-1", "--out", str(tmp_path / "negative"))
    assert negative.returncode == 2 and "decision_ms must be >= 0 milliseconds per decision, got -1.0" in negative.stderr


def test_help_and_version_list_every_command_without_importing_torch():
    """``adaptive --help`` lists every command from its summary table and ``--version`` names the package, neither
    importing torch (the listing stays instant); running a command imports its module only then."""
    probe = "import sys\nfrom lab.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\nprint('torch loaded:', 'torch' in sys.modules)"
    listing = subprocess.run([sys.executable, "-c", probe, "--help"], capture_output=True, text=True, timeout=60)
    assert all(name in listing.stdout for name in COMMANDS) and "torch loaded: False" in listing.stdout
    version = subprocess.run([sys.executable, "-c", probe, "--version"], capture_output=True, text=True, timeout=60)
    assert version.stdout.startswith("adaptive-draft 0.") and "torch loaded: False" in version.stdout
    typo = run("generat", "x")
    assert typo.returncode == 2 and "invalid choice: 'generat'" in typo.stderr
