"""The project's speculative decoding against llama.cpp's, with the same EAGLE-3 head, live, on the same prompts.

Compared on the test split's first ``--per-language`` prompts of each language (chat format), greedy, up to
``--new-tokens`` new tokens (both stop at the end-of-sequence token), same machine, same threads: the project's
plain decoding and each ``--policies`` entry (static depths, rules, learned policies) with the shipped head, and
each ``--trees`` entry (a draft tree of shape K,W,V grown as the policy says), its target run through ``--engine``
(default compiled-int4); and llama.cpp's ``llama-speculative-simple`` with the head
converted by llama.cpp's own converter (``--spec-type draft-eagle3``), for every target file of
``scripts/setup_llamacpp.sh`` (the shipped Q4_1 file and its BF16 re-typing) and every ``--n-max`` × ``--p-min``
(``--spec-draft-n-max``: most tokens drafted per round; ``--spec-draft-p-min``: drafting stops below this draft
probability). Every configuration runs on every prompt back to back, in rotating order (:func:`lab.live_protocol.measure`).

Time per generation: prefill plus decoding, models already loaded — for the project the decoder's own clock, for
llama.cpp the "encoded" plus "decoded" seconds it prints (its process start and model load are not counted). Token
counts: the project's emitted tokens; llama.cpp's generated text, tokenized again by the pair's tokenizer.
Reported per configuration: tokens/s per language and overall, the per-token acceptance (the project's
accepted / (accepted + rejections); llama.cpp's n_accept / n_drafted), and each project configuration against the
best llama.cpp configuration (the highest overall tokens/s of its side) with a 95 % paired bootstrap interval over
prompts. A killed run resumes from OUT.partial.jsonl (same arguments, same machine).

Set-up (once, optional): bash scripts/setup_llamacpp.sh
Run: .venv/bin/python benchmarks/peer_speculative.py [--per-language 12] [--engine lean-int4]
     [--policies static:3,static:4,static:5,confidence,benchmarks/kept-policies/quickstart] [--n-max 4,8] [--p-min 0,0.3,0.5,0.7]
     [--trees "4,4,4@static:3;4,4,8@benchmarks/kept-policies/tree"]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
from pathlib import Path

import torch

from adaptive import SamplingConfig, SpeculativeDecoder, load_pair
from adaptive.engines import ENGINES, use_engine
from adaptive.generation import GenerationResult
from adaptive.models import cache_root, smollm2_gguf_path
from adaptive.profiling import hardware_description
from adaptive.tree import TreeShape
from adaptive.tree_decoder import TreeDecoder
from adaptive.workload import LANGUAGES
from lab import live_protocol
from lab.report import format_table
from policies import make_policy

GREEDY = SamplingConfig(0.0)
LOG_NUMBER = r"([0-9.]+)"


def llama_root() -> Path:
    """Where scripts/setup_llamacpp.sh put llama.cpp's binaries, the converted head and the BF16 target."""
    return cache_root() / "llama.cpp"


def logged(pattern: str, log: str) -> float:
    """The number ``pattern`` captures in llama.cpp's log; a clear error where the log lacks it."""
    found = re.search(pattern, log)
    if found is None:
        raise RuntimeError(f"llama.cpp's log has no line matching {pattern!r}; its last lines:\n{log[-2000:]}")
    return float(found.group(1))


class LlamaCppSpeculative:
    """``llama-speculative-simple`` on one target file with the converted head, as a decoder the live protocol runs."""

    def __init__(self, binary: Path, target: Path, head: Path, n_max: int, p_min: float, tokenizer, threads: int) -> None:
        self.binary, self.target, self.head, self.tokenizer = binary, target, head, tokenizer
        self.n_max, self.p_min, self.threads = n_max, p_min, threads
        self.acceptance: list[tuple[int, int]] = []
        """(accepted, drafted) of every generation."""

    def generate(self, ids: list[int], new_tokens: int, seed: int = 0) -> GenerationResult:
        prompt = self.tokenizer.decode(ids, skip_special_tokens=False)
        command = [
            str(self.binary), "-m", str(self.target), "-md", str(self.head), "--spec-type", "draft-eagle3",
            "--spec-draft-n-max", str(self.n_max), "--spec-draft-p-min", str(self.p_min),
            "-p", prompt, "-n", str(new_tokens), "--temp", "0", "--top-k", "1", "--seed", str(seed),
            "-t", str(self.threads), "-td", str(self.threads), "-c", str(len(ids) + new_tokens + 64),
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, encoding="utf-8", errors="replace")
        log = done.stdout + done.stderr
        if done.returncode != 0:
            raise RuntimeError(f"llama-speculative-simple failed (rc {done.returncode}):\n{log[-2000:]}")
        encoded = int(logged(r"encoded\s+(\d+) tokens", log))
        if encoded != len(ids):
            raise RuntimeError(f"llama.cpp read the prompt as {encoded} tokens, the pair's tokenizer as {len(ids)}: the prompts would differ")
        seconds = logged(rf"encoded\s+\d+ tokens in\s+{LOG_NUMBER} seconds", log) + logged(rf"decoded\s+\d+ tokens in\s+{LOG_NUMBER} seconds", log)
        self.acceptance.append((int(logged(r"n_accept\s*=\s*(\d+)", log)), int(logged(r"n_drafted\s*=\s*(\d+)", log))))
        text = done.stdout.split(prompt, 1)[-1] if prompt in done.stdout else done.stdout
        tokens = self.tokenizer.encode(text.strip("\n"), add_special_tokens=False)
        return GenerationResult(ids, tokens, [], 0.0, seconds, "llama.cpp", text, first_token_time=float("nan"))


def acceptance(live: dict, name: str, llama: dict[str, LlamaCppSpeculative]) -> str:
    """The project's per-token acceptance α = accepted / (accepted + rejections); llama.cpp's accepted / drafted
    over the generations this process ran (a resumed run's earlier prompts are not in it)."""
    if name in llama:
        pairs = llama[name].acceptance
        accepted, drafted = sum(a for a, _ in pairs), sum(d for _, d in pairs)
        return f"{accepted / drafted:.3f} of drafted ({len(pairs)} generations)" if drafted else "-"
    accepted, rejections = sum(r["accepted"] for r in live[name]), sum(r["rejections"] for r in live[name])
    return f"α {accepted / (accepted + rejections):.3f}" if accepted + rejections else "-"


def tree_decoder_factory(pair, shape: TreeShape, spec: str):
    """A factory of tree decoders of ``shape`` under the policy ``spec`` (a fresh policy each generation)."""
    return lambda: TreeDecoder(pair.target, pair.draft, make_policy(spec), shape, tokenizer=pair.tokenizer)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-language", type=int, default=12)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--engine", choices=list(ENGINES), default="compiled-int4")
    parser.add_argument("--policies", default="static:3,static:4,static:5,confidence,benchmarks/kept-policies/quickstart")
    parser.add_argument("--trees", default="", help="draft trees, SHAPE@POLICY separated by ';', e.g. '4,4,4@static:3' (greedy; K,W,V as --tree)")
    parser.add_argument("--n-max", default="4,8", help="llama.cpp's --spec-draft-n-max values, comma-separated")
    parser.add_argument("--p-min", default="0,0.3,0.5,0.7", help="llama.cpp's --spec-draft-p-min values, comma-separated")
    parser.add_argument("--targets", default="Q4_1,BF16", help="llama.cpp target files: Q4_1 (shipped), BF16 (re-typed by the set-up script)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/peer_speculative"))
    args = parser.parse_args()
    root = llama_root()
    binary, head = root / "build" / "bin" / "llama-speculative-simple", root / "smollm2-135m-eagle3.gguf"
    files = {"Q4_1": smollm2_gguf_path(), "BF16": root / "smollm2-135m-bf16.gguf"}
    targets = args.targets.split(",")
    for path in [binary, head, *(files[t] for t in targets if t in files)]:
        if not path.exists():
            parser.error(f"{path} is missing: run `bash scripts/setup_llamacpp.sh` first")
    if unknown := [t for t in targets if t not in files]:
        parser.error(f"--targets takes {', '.join(files)}, got {', '.join(unknown)}")
    torch.set_num_threads(args.threads)
    pair = load_pair("smollm2-135m", "auto")
    use_engine((pair.target, pair.draft), args.engine)
    prompts, ids = live_protocol.first_prompts(pair, "test", args.per_language)
    decoders = {
        f"{spec} ({args.engine})": (lambda spec=spec: SpeculativeDecoder(pair.target, pair.draft, make_policy(spec), GREEDY, tokenizer=pair.tokenizer))
        for spec in args.policies.split(",")
    }
    trees = [entry.split("@", 1) for entry in args.trees.split(";") if entry]
    for shape, spec in trees:
        decoders[f"tree {shape} {spec} ({args.engine})"] = tree_decoder_factory(pair, TreeShape.parse(shape), spec)
    llama = {
        f"llama.cpp {target} n_max {n_max} p_min {p_min}": LlamaCppSpeculative(
            binary, files[target], head, int(n_max), float(p_min), pair.tokenizer, args.threads
        )
        for target in targets
        for n_max in args.n_max.split(",")
        for p_min in args.p_min.split(",")
    }
    decoders.update({name: (lambda runner=runner: runner) for name, runner in llama.items()})
    specs = args.policies.split(",") + [spec for _, spec in trees]
    identity = {"engine": args.engine, "llama.cpp": str(binary), "head": str(head), "policies": live_protocol.policy_digests(specs), "trees": args.trees}
    checkpoint = args.out.with_name(args.out.name + ".partial.jsonl")
    live = live_protocol.measure(pair.target, prompts, ids, decoders, args.new_tokens, args.repeats, "peer", GREEDY, 0, checkpoint, identity)
    numbers = live_protocol.summarise(live)
    ours = [name for name in live if name not in llama]
    best_ours = max(ours, key=lambda name: numbers[name]["all"]["tokens_per_second"])
    best_llama = max(llama, key=lambda name: numbers[name]["all"]["tokens_per_second"])
    against_best = {name: live_protocol.compare(live, name, best_llama) for name in ours if name != live_protocol.PLAIN}
    comparison = against_best[best_ours]
    rows = [
        [
            name,
            *(f"{numbers[name][lang]['tokens_per_second']:.1f}" for lang in LANGUAGES),
            f"{numbers[name]['all']['tokens_per_second']:.1f}",
            acceptance(live, name, llama),
            f"{against_best[name]['ratio']:.3f}x [{against_best[name]['low']:.3f}, {against_best[name]['high']:.3f}]" if name in against_best else "-",
        ]
        for name in live
    ]
    hardware = hardware_description(pair.target.device)
    lines = [
        f"# The project against llama.cpp, same EAGLE-3 head ({pair.name}, greedy, up to {args.new_tokens} new tokens)",
        "",
        f"Hardware: {hardware['processor']} ({hardware['machine']}, {hardware['matrix_flags']}), "
        f"{args.threads} threads; project engine {args.engine}, torch {torch.__version__}; llama.cpp from scripts/setup_llamacpp.sh.",
        f"Prompts: test split, first {args.per_language} per language ({len(prompts)}); {args.repeats} run(s) per configuration per prompt, rotating order.",
        "",
        format_table(["configuration", *LANGUAGES, "all tok/s", "acceptance", "/ llama.cpp's best [95 %]"], rows),
        "",
        f"Best of the project: `{best_ours}`; best of llama.cpp: `{best_llama}`.",
        f"Project / llama.cpp, tokens/s, paired over prompts: {comparison['ratio']:.3f}x "
        f"[{comparison['low']:.3f}, {comparison['high']:.3f}] ({comparison['verdict']}).",
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    summary = {
        "numbers": numbers,
        "acceptance": {name: acceptance(live, name, llama) for name in live},
        "best": [best_ours, best_llama],
        "comparison": comparison,
        "against_llama_best": against_best,
    }
    args.out.with_name(args.out.name + ".json").write_text(json.dumps(summary, indent=1))
    args.out.with_name(args.out.name + ".md").write_text("\n".join(lines) + "\n")
    checkpoint.unlink()
    print("\n".join(lines))


if __name__ == "__main__":
    main()
