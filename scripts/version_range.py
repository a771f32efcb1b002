"""
The Hugging Face stack at both ends of setup.py's ranges, as scripts/test_version_range.sh runs it.

    python scripts/version_range.py requirements floor    # pip requirements: each range's lowest release
    python scripts/version_range.py requirements newest   # pip requirements: the ranges as setup.py states them
    python scripts/version_range.py save DIR              # a tiny model of every tower kind and objective, saved
    python scripts/version_range.py load DIR              # each loaded as Hub custom code, checked against `save`

`save` runs where twotower is installed (the pinned .venv: the models the main job would publish); `load` runs in
the venv under test, in DIR, where the package cannot be imported: `trust_remote_code=True` loads the copy of
modeling_twotower/ beside each model, as a downloader's transformers does. It checks the logits, greedy
generation (with the cache where the kind keeps one, and without), the probes' and the joint model's
log-probabilities and the mean-ablation increases.
"""

import argparse
import ast
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# The packages whose releases the custom code meets on a downloader's machine. torch stays at the CPU pin
# (constraints.txt): PyPI's other torch builds are CUDA ones, gigabytes each.
RANGED_PACKAGES = ("transformers", "accelerate", "huggingface-hub", "tokenizers", "safetensors")
# Tiny, odd sizes (tests/conftest.py's), two probe replicas so that `all_replicas` has something to stack.
TINY_SIZES = dict(
    vocab_size=99, hidden_size=12, num_hidden_layers=2, num_attention_heads=3, intermediate_size=37,
    max_position_embeddings=32, probe_replicas=2, pad_token_id=0,
)  # fmt: skip
BATCH, SEQ, NEW_TOKENS = 2, 9, 5


def declared_ranges(setup_py: Path = REPO / "setup.py") -> dict[str, str]:
    """{package: its requirement} for RANGED_PACKAGES, read from setup.py's install_requires."""
    tree = ast.parse(setup_py.read_text(encoding="utf-8"))
    calls = (node for node in ast.walk(tree) if isinstance(node, ast.Call))
    call = next(node for node in calls if getattr(node.func, "id", "") == "setup")
    install_requires = next(keyword.value for keyword in call.keywords if keyword.arg == "install_requires")
    requirements = [ast.literal_eval(element) for element in install_requires.elts]
    ranges = {re.match(r"[A-Za-z0-9_.-]+", requirement).group(0): requirement for requirement in requirements}
    return {package: ranges[package] for package in RANGED_PACKAGES}


def requirements(end: str) -> list[str]:
    """pip requirements of RANGED_PACKAGES: each at its floor (`floor`) or as declared, for pip's newest (`newest`)."""
    if end == "newest":
        return list(declared_ranges().values())
    floors = []
    for package, requirement in declared_ranges().items():
        floor = re.search(r">=\s*([0-9][^,\s]*)", requirement)
        if floor is None:
            raise SystemExit(f"setup.py declares {requirement!r}: a range without a floor (>=) cannot be tested")
        floors.append(f"{package}=={floor.group(1)}")
    return floors


def variants():
    """{name: (model class, config fields)}: every tower kind of the config with each objective it has, in the bert
    layout, and the reference's gpt (causal transformer) and elmo (masked LSTM) layouts."""
    from modeling_twotower import TwoTowerConfig, TwoTowerForCausalLM, TwoTowerForMaskedLM
    from modeling_twotower.configuration_twotower import TOWER_TYPES

    candidates = {
        f"{kind}_{objective}": (model_class, dict(tower_type=kind))
        for kind in TOWER_TYPES
        for objective, model_class in (("causal", TwoTowerForCausalLM), ("masked", TwoTowerForMaskedLM))
    }
    candidates["gpt_causal"] = (TwoTowerForCausalLM, dict(layout="gpt"))
    candidates["elmo_masked"] = (TwoTowerForMaskedLM, dict(layout="elmo"))
    found = {}
    for name, (model_class, fields) in candidates.items():
        try:
            TwoTowerConfig(**TINY_SIZES, **fields, bidirectional=model_class is TwoTowerForMaskedLM)
        except ValueError:  # a combination the config rejects: this kind has no such objective
            continue
        found[name] = (model_class, fields)
    return found


def scoring_inputs(objective: str, generator):
    """input_ids [batch, seq] and labels: the next tokens (causal) or every third position (masked, -100 elsewhere)."""
    import torch

    input_ids = torch.randint(1, TINY_SIZES["vocab_size"], (BATCH, SEQ), generator=generator)
    if objective == "causal":
        return input_ids, input_ids
    labels = torch.full_like(input_ids, -100)
    labels[:, 1::3] = input_ids[:, 1::3]
    return input_ids, labels


def outputs(model, objective: str, input_ids, labels) -> dict:
    """What `load` compares: logits, generation, probe and joint log-probabilities, mean-ablation increases."""
    import torch

    with torch.no_grad():
        result = {"logits": model(input_ids).logits}
        if objective == "causal":
            prompt = input_ids[:, :4]
            result["generated"] = model.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False)
            result["generated_without_cache"] = model.generate(
                prompt, max_new_tokens=NEW_TOKENS, do_sample=False, use_cache=False
            )
        result["probe_logprobs"] = model.probe_logprobs(input_ids, labels=labels, all_replicas=True)
        result["joint_logprobs"] = model.joint_logprobs(input_ids, labels=labels)
        features, targets = model.scored_features(model.probe_features(input_ids), labels)
        result["ablation_increases"] = model.ablation_increases(features, targets, features.mean(dim=1))
    return result


def save(folder: Path):
    """Saves a tiny model of every variant into folder/NAME, with its inputs and outputs in folder/expected.pt."""
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    expected, manifest = {}, {}
    for name, (model_class, fields) in variants().items():
        torch.manual_seed(0)
        model = model_class(model_class.config_class(**TINY_SIZES, **fields)).eval()
        model.save_pretrained(folder / name)
        objective = "masked" if model_class.__name__.endswith("MaskedLM") else "causal"
        input_ids, labels = scoring_inputs(objective, torch.Generator().manual_seed(1))
        expected[name] = {"input_ids": input_ids, "labels": labels, **outputs(model, objective, input_ids, labels)}
        manifest[name] = {"objective": objective, "tower_type": model.config.tower_type}
    torch.save(expected, folder / "expected.pt")
    (folder / "variants.json").write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    print(f"saved {len(manifest)} models: {', '.join(manifest)}")


def load(folder: Path):
    """Loads each model that `save` wrote as Hub custom code and checks its outputs; exits 1 on any failure."""
    sys.modules["modeling_twotower"] = None  # the package must not be importable here
    try:
        import modeling_twotower  # noqa: F401
    except ImportError:
        pass
    else:
        raise SystemExit("modeling_twotower is importable: `load` checks the copy saved beside each model")
    import torch
    import transformers

    manifest = json.loads((folder / "variants.json").read_text(encoding="utf-8"))
    expected = torch.load(folder / "expected.pt")
    failures = []
    for name, facts in manifest.items():
        try:
            auto_class = {"causal": transformers.AutoModelForCausalLM, "masked": transformers.AutoModelForMaskedLM}[
                facts["objective"]
            ]
            model = auto_class.from_pretrained(folder / name, trust_remote_code=True)
            assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
            assert model.config.tower_type == facts["tower_type"], model.config.tower_type
            want = expected[name]
            got = outputs(model, facts["objective"], want["input_ids"], want["labels"])
            for key, value in got.items():
                if value.dtype.is_floating_point:
                    torch.testing.assert_close(value, want[key], msg=lambda message, key=key: f"{key}: {message}")
                else:
                    assert torch.equal(value, want[key]), f"{key}: {value.tolist()} != {want[key].tolist()}"
            if "generated" in got:
                assert torch.equal(got["generated"], got["generated_without_cache"]), "cache changes generation"
            print(f"  ok      {name} ({', '.join(got)})")
        except Exception as error:  # noqa: BLE001 (every variant is reported, then the exit status says)
            failures.append(name)
            print(f"  FAILED  {name}: {type(error).__name__}: {str(error)[:2000]}")
    versions = {package: __import__(package).__version__ for package in ("torch", "transformers")}
    print(f"remote code: {len(manifest) - len(failures)} of {len(manifest)} variants passed ({versions})")
    if failures:
        raise SystemExit(1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].strip())
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("requirements", help="pip requirements of one end of the ranges").add_argument(
        "end", choices=["floor", "newest"]
    )
    commands.add_parser("save", help="save the tiny models and their outputs").add_argument("folder", type=Path)
    commands.add_parser("load", help="load them as Hub custom code and compare").add_argument("folder", type=Path)
    args = parser.parse_args()
    if args.command == "requirements":
        print("\n".join(requirements(args.end)))
    elif args.command == "save":
        save(args.folder)
    else:
        load(args.folder)


if __name__ == "__main__":
    main()
