"""Bad and hostile inputs: nothing a user shares runs code, and every refusal is one line naming the cause, exit 2.

Each payload below is a real pickle whose unpickling would create a canary file; the tests assert that the canary
never appears and that the loader refuses the file by name.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from adaptive.batch_decoder import BatchedSpeculativeDecoder
from adaptive.decoder import SpeculativeDecoder, generate_plain
from adaptive.eagle3 import CONFIG, WEIGHTS, load_head
from adaptive.generation import ContextTooLong
from adaptive.learned_policy import load_policy
from adaptive.pair import check_device, load_draft_for, load_pair_from_paths
from adaptive.traces import TraceSet
from adaptive.tree import TreeShape
from adaptive.tree_decoder import TreeDecoder
from lab.cli import main
from lab.config import config_from_dict
from lab.runs import check_output_folder, new_run_folder
from lab.training import train
from policies import StaticDepth
from policies.batch import FixedBatchDepth
from tests.conftest import brief_synthetic_config, tiny_llama

ROOT = Path(__file__).resolve().parents[1]


class Payload:
    """Unpickling this creates ``canary``: what a crafted file would do."""

    def __init__(self, canary: Path) -> None:
        self.canary = str(canary)

    def __reduce__(self):
        return (os.system, (f"touch {self.canary}",))


def refused(argv: list[str], capsys, *needles: str) -> str:
    """Run the CLI, assert exit 2 with one line naming every needle and no traceback; return the line."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and err.count("\n") == 0, err
    for needle in needles:
        assert needle in err, (needle, err)
    return err


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("runs") / "brief"
    train(config_from_dict(brief_synthetic_config("brief", 2)), folder)
    return folder


def crafted_copy(run: Path, into: Path) -> Path:
    copy = into / "crafted"
    shutil.copytree(run, copy)
    return copy


def test_a_resume_folder_with_a_pickled_optimiser_state_runs_nothing(run, tmp_path, capsys):
    crafted, canary = crafted_copy(run, tmp_path), tmp_path / "canary"
    (state := json.loads((crafted / "state.json").read_text())).update(phase=0, done=0)
    (crafted / "state.json").write_text(json.dumps(state))
    optimiser = next((crafted / "checkpoints").glob("*/depth.optimizer.pt"))
    torch.save({"state": Payload(canary)}, optimiser)
    refused(["train", "--resume", str(crafted)], capsys, str(optimiser))
    assert not canary.exists()


def test_a_resume_folder_with_a_stable_baselines_zip_runs_nothing(run, tmp_path, capsys):
    crafted, canary = crafted_copy(run, tmp_path), tmp_path / "canary"
    shutil.rmtree(crafted / "checkpoints")
    (crafted / "checkpoints").mkdir()
    (crafted / "checkpoints" / "depth.zip").write_bytes(pickle.dumps(Payload(canary)))
    (crafted / "state.json").write_text(json.dumps({"phase": 0, "done": 10, "models": ["depth"]}))
    refused(["train", "--resume", str(crafted)], capsys, "state.json")
    assert not canary.exists()


def test_a_config_initialised_from_a_crafted_run_runs_nothing(run, tmp_path, capsys):
    crafted, canary = crafted_copy(run, tmp_path), tmp_path / "canary"
    for weights in (crafted / "checkpoints").glob("*/depth.safetensors"):
        weights.write_bytes(pickle.dumps(Payload(canary)))
    config = tmp_path / "init.yaml"
    config.write_text(yaml.safe_dump({**brief_synthetic_config("init"), "init_from": str(crafted)}))
    refused(["train", str(config), "--runs", str(tmp_path / "runs")], capsys, "depth.safetensors")
    assert not canary.exists()
    assert not list((tmp_path / "runs").iterdir()), "a refused start leaves no run folder"


def test_a_crafted_policy_runs_nothing(run, tmp_path, capsys):
    crafted, canary = crafted_copy(run, tmp_path), tmp_path / "canary"
    generate = ["generate", "--target", "t", "--draft", "d", "--policy", str(crafted), "hi"]  # the policy is read before any model
    (crafted / "final" / "policy.safetensors").write_bytes(pickle.dumps(Payload(canary)))
    refused(generate, capsys, "policy.safetensors", "not a readable safetensors file")
    assert not canary.exists()
    (crafted / "final" / "policy.safetensors").unlink()
    refused(generate, capsys, "policy.safetensors", "does not exist")
    (crafted / "final" / "policy.json").write_bytes(pickle.dumps(Payload(canary)))
    refused(generate, capsys, "policy.json", "not UTF-8 text")
    assert not canary.exists()


def test_a_policy_for_another_pair_is_refused(run, tmp_path, capsys):
    refused(["generate", "--pair", "smollm2-135m", "--policy", str(run), "hi"], capsys, "trained for pair 'synthetic'", "smollm2-135m")


def test_a_policy_with_weights_of_other_shapes_is_refused(run, tmp_path):
    crafted = crafted_copy(run, tmp_path)
    metadata = json.loads((crafted / "final" / "policy.json").read_text())
    metadata["depth_layers"] = [metadata["depth_layers"][0], 7, 2]
    (crafted / "final" / "policy.json").write_text(json.dumps(metadata))
    with pytest.raises(ValueError, match="wrong shape"):
        load_policy(crafted)


def _trace_file(tmp_path: Path) -> Path:
    return Path(shutil.copy(ROOT / "data" / "traces" / "smollm2-135m-val-copy.npz", tmp_path / "traces.npz"))


def test_crafted_and_damaged_trace_files_are_refused_by_name(tmp_path):
    canary = tmp_path / "canary"
    pickled = tmp_path / "pickled.npz"
    np.savez(pickled, metadata=np.array("{}"), match=np.array([Payload(canary)], dtype=object))
    with pytest.raises(ValueError, match=r"pickled.npz is refused: its array 'match' holds pickled"):
        TraceSet.load(pickled)
    assert not canary.exists()
    good = _trace_file(tmp_path)
    cut = tmp_path / "cut.npz"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(ValueError, match="cut.npz is not a readable .npz file"):
        TraceSet.load(cut)
    noise = tmp_path / "noise.npz"
    noise.write_bytes(os.urandom(4096))
    with pytest.raises(ValueError, match="noise.npz") as error:
        TraceSet.load(noise)
    assert "allow_pickle=True" not in str(error.value)
    arrays = dict(np.load(good, allow_pickle=False))
    arrays["outputs"] = arrays["outputs"][:-5]
    np.savez(tmp_path / "short.npz", **arrays)
    with pytest.raises(ValueError, match="short.npz: its per-prompt arrays disagree"):
        TraceSet.load(tmp_path / "short.npz")


def test_heads_are_checked_key_by_key_and_shape_by_shape(model_folders, tmp_path):
    target = load_pair_from_paths(model_folders["target"], model_folders["draft"], "float32").target
    config = json.loads((Path(model_folders["head"]) / CONFIG).read_text())

    def head_with(change: dict, weights: bytes | None = None) -> Path:
        folder = tmp_path / f"head{len(list(tmp_path.iterdir()))}"
        shutil.copytree(model_folders["head"], folder)
        (folder / CONFIG).write_text(json.dumps({k: v for k, v in {**config, **change}.items() if v is not None}))
        if weights is not None:
            (folder / WEIGHTS).write_bytes(weights)
        return folder

    with pytest.raises(ValueError, match="names no target layers"):
        load_draft_for(target, head_with({"eagle_config": None}))
    with pytest.raises(ValueError, match=r"wrong shape d2t \(9,\) \(expected \(16,\)\); lm_head.weight \(9, 32\)"):
        load_head(head_with({"draft_vocab_size": None}), target)
    with pytest.raises(ValueError, match="wrong shape midlayer.mlp"):
        load_head(head_with({"intermediate_size": 48}), target)
    whole = (Path(model_folders["head"]) / WEIGHTS).read_bytes()
    with pytest.raises(ValueError, match="is not a readable safetensors file"):
        load_head(head_with({}, whole[: len(whole) // 2]), target)
    with pytest.raises(ValueError, match="draft folder .*nowhere does not exist"):
        load_draft_for(target, tmp_path / "nowhere")


@pytest.mark.parametrize(
    ("text", "needle"),
    [("", "is empty"), ("name: [unclosed\n", "is not valid YAML at line"), ("seed: 1\n", "names no experiment"), ("- a\n- b\n", "top level must be a mapping")],
)
def test_bad_config_files_are_refused_with_file_and_line(text, needle, tmp_path, capsys):
    config = tmp_path / "bad.yaml"
    config.write_text(text)
    refused(["train", str(config), "--runs", str(tmp_path / "runs")], capsys, str(config), needle)
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").iterdir())


def test_a_missing_profile_leaves_no_run_folder(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({**brief_synthetic_config("p"), "env": {"backend": "replay", "profile": str(tmp_path / "none.json")}}))
    refused(["train", str(config), "--runs", str(tmp_path / "runs")], capsys, "none.json")
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").iterdir())


def test_output_paths_are_checked_before_any_work(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(ValueError, match="is a file, not a folder"):
        check_output_folder(afile, "--runs")
    with pytest.raises(ValueError, match="cannot be written to"):
        check_output_folder(afile / "below", "--out")
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(brief_synthetic_config("o")))
    refused(["train", str(config), "--runs", str(afile)], capsys, str(afile), "not a folder")


def test_runs_started_in_the_same_second_get_their_own_folders(tmp_path):
    folders = {new_run_folder(tmp_path, "same") for _ in range(3)}
    assert len(folders) == 3 and all(folder.is_dir() for folder in folders)


def test_a_run_killed_before_its_first_checkpoint_resumes_and_the_latest_link_follows(tmp_path, capsys):
    runs = tmp_path / "runs"
    folder = new_run_folder(runs, "early")
    (folder / "config.yaml").write_text(yaml.safe_dump(brief_synthetic_config("early", 2)))  # all a kill at 1 s leaves
    assert main(["train", "--resume", str(folder)]) == 0
    assert (runs / "early-latest").resolve() == folder.resolve()
    assert (folder / "final" / "policy.json").is_file()


def test_an_unavailable_device_and_undecodable_arguments_are_refused(capsys):
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="'cuda' is not available on this machine; allowed here: cpu|'cuda' is not available"):
            check_device("cuda")
        refused(["generate", "--pair", "smollm2-135m", "--device", "cuda", "hi"], capsys, "'cuda'", "allowed here: cpu")
    with pytest.raises(ValueError, match="not a device name"):
        check_device("gpu please")
    with pytest.raises(SystemExit) as exit_:
        main(["generate", "--pair", "smollm2-135m", "caf\udce9"])
    assert exit_.value.code == 2 and "not valid UTF-8" in capsys.readouterr().err


@pytest.fixture(scope="module")
def short_context():
    """A tiny target and draft that attend over 24 positions."""
    target, draft = tiny_llama(0), tiny_llama(1, layers=1)
    for model in (target, draft):
        model.config.max_position_embeddings = 24
    return target, draft


def test_a_prompt_that_fills_the_context_is_refused_naming_both_numbers(short_context):
    target, draft = short_context
    for run in (
        lambda prompt: SpeculativeDecoder(target, draft, StaticDepth(3)).generate(prompt, 4),
        lambda prompt: generate_plain(target, prompt, 4),
        lambda prompt: BatchedSpeculativeDecoder(target, draft, FixedBatchDepth(3)).generate([prompt], 4),
    ):
        with pytest.raises(ContextTooLong, match="the prompt has 24 tokens; the models attend over at most 24 positions|at most 24 positions"):
            run(list(range(8)) * 3)


def test_generation_stops_where_the_context_is_full_in_every_decoder(short_context):
    target, draft = short_context
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]  # 14 positions left
    plain = generate_plain(target, prompt, 100)
    chain = SpeculativeDecoder(target, draft, StaticDepth(6)).generate(prompt, 100)
    tree = TreeDecoder(target, draft, StaticDepth(6), TreeShape(2, 2, 6)).generate(prompt, 100)
    (batched,) = BatchedSpeculativeDecoder(target, draft, FixedBatchDepth(6)).generate([prompt], 100)
    for result in (plain, chain, tree, batched):
        assert result.stop_reason == "context" and len(result.token_ids) == 14
    assert chain.token_ids == plain.token_ids == tree.token_ids == batched.token_ids  # greedy identity up to the limit
    assert generate_plain(target, prompt, 5).stop_reason == "length"


def test_a_crafted_batch_policy_and_a_pickled_model_folder_run_nothing(tmp_path):
    """A batch policy whose weights (or sidecar) are a pickle, and a model folder that has only pickled weights
    (``pytorch_model.bin``): refused by name, no payload runs."""
    from adaptive.learned_batch_policy import FORMAT, SIDECAR, WEIGHTS, load_batch_policy
    from adaptive.pair import load_model

    canary, folder = tmp_path / "canary", tmp_path / "batch-policy"
    folder.mkdir()
    (folder / SIDECAR).write_text(json.dumps({"format": FORMAT, "layers": [4, 3], "schema": {}, "profile": {}}))
    (folder / WEIGHTS).write_bytes(pickle.dumps(Payload(canary)))
    with pytest.raises(ValueError, match=WEIGHTS):
        load_batch_policy(folder)
    (folder / SIDECAR).write_bytes(pickle.dumps(Payload(canary)))
    with pytest.raises(ValueError, match=SIDECAR):
        load_batch_policy(folder)
    model_folder = tmp_path / "model"
    tiny_llama(0).save_pretrained(model_folder)
    (model_folder / "model.safetensors").unlink()
    torch.save({"weights": Payload(canary)}, model_folder / "pytorch_model.bin")
    with pytest.raises(ValueError, match="safetensors weights and config.json expected"):
        load_model(model_folder, "float32")
    assert not canary.exists()
