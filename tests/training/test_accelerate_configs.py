"""
Every shipped accelerate config (training/accelerate_configs/) on 2 CPU processes: it trains like 1 process, also
with gradient accumulation, resumes bitwise from its own checkpoint and saves a full model that loads by remote code.

The configs say MULTI_GPU, FSDP and DEEPSPEED; on CPU processes Accelerate drops the FSDP and DeepSpeed plugins and
trains plain DDP, so those two launch tests/training/launch_forced_plugin.py, which puts the plugin back in force, and each
test checks that it was (the run's own report of its distributed type, and the checkpoint's layout). Every launch
passes the training's --cpu (accelerate launch's --cpu starts one process) and `--mixed_precision no` (the configs
say bf16): the runs are compared with a 1-process float32 run.
"""

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from torch.nn import functional as F
from transformers import AutoModelForCausalLM

from test_training import corpus, tensorboard_scalars, tiny_config, validation_blocks  # noqa: F401 (a fixture)
from twotower.training.data.tokenizer import load_tokenizer
from twotower.training.train import training_function
from conftest import HANG_LIMIT_S

pytestmark = pytest.mark.slow  # launches processes or trains several models: `-m "not slow"` skips it

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIGS_DIR = REPO_ROOT / "training" / "accelerate_configs"
LAUNCHER = Path(__file__).with_name("launch_forced_plugin.py")
ACCELERATE = Path(sys.executable).with_name("accelerate")
NUM_PROCESSES = 2
PER_DEVICE_BATCH = 4  # x 2 processes = the 1-process run's batch of 8
ACCUMULATION = 4  # micro-batches per optimizer step: a global batch of 32 blocks
MAX_STEPS = 6
CHECKPOINT_STEP = 3  # the resumed runs start from this step's checkpoint
# The forced distributed type of each config, and the checkpoint file that only that plugin writes
CONFIGS = {
    "ddp": ("MULTI_CPU", "optimizer.bin"),
    "fsdp": ("FSDP", "pytorch_model_fsdp_0/__1_0.distcp"),  # rank 1's shard of the sharded state dict
    "deepspeed_zero2": ("DEEPSPEED", "pytorch_model/zero_pp_rank_1_mp_rank_00_optim_states.pt"),
}

try:
    import deepspeed  # noqa: F401

    HAS_DEEPSPEED = True
except ImportError:
    HAS_DEEPSPEED = False


def config_params():
    """The configs as test parameters; the DeepSpeed one skips, saying why, where DeepSpeed is not installed."""
    skip = pytest.mark.skipif(not HAS_DEEPSPEED, reason="deepspeed_zero2.yaml needs `pip install deepspeed` "
                              "(scripts/install.sh installs it, CPU only, DS_BUILD_OPS=0)")
    return [pytest.param(name, id=name, marks=[skip] if name.startswith("deepspeed") else []) for name in CONFIGS]


def training_options(corpus: dict, output_dir: Path, **overrides) -> list[str]:
    """The training command's options: the tiny recipe, 6 steps of 4 accumulated micro-batches, no dropout."""
    options = dict(
        recipe="tiny", cpu="true", **corpus, output_dir=output_dir, tokenizer_vocab_size=512, block_size=32,
        max_train_blocks=200, max_eval_blocks=32, per_device_train_batch_size=PER_DEVICE_BATCH,
        gradient_accumulation_steps=ACCUMULATION, max_train_steps=MAX_STEPS, checkpointing_steps=CHECKPOINT_STEP,
        logging_steps=1, disable_tqdm="true", peak_tflops=1, hidden_dropout=0, attention_dropout=0,
    )
    options.update(overrides)
    return [f"--{name}={value}" for name, value in options.items()]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch_command(config_name: str, options: list[str], *launch_options: str) -> list[str]:
    """`accelerate launch --config_file CONFIG` of the training (the forced-plugin launcher for FSDP and DeepSpeed)."""
    script = ["-m", "twotower.training.train"] if config_name == "ddp" else [str(LAUNCHER)]
    return [str(ACCELERATE), "launch", "--config_file", str(CONFIGS_DIR / f"{config_name}.yaml"),
            "--num_processes", str(NUM_PROCESSES), "--mixed_precision", "no", *launch_options, *script, *options]


def accelerate_launch(config_name: str, options: list[str], *launch_options: str) -> str:
    """Run one launch to its end; returns its output (stdout and stderr)."""
    launch_options = launch_options or ("--main_process_port", str(free_port()))
    launched = subprocess.run(launch_command(config_name, options, *launch_options), cwd=REPO_ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=HANG_LIMIT_S)
    assert launched.returncode == 0, launched.stdout[-6000:]
    return launched.stdout


def optimizer_steps(checkpoint: Path, config_name: str) -> set[int]:
    """The optimizer step count(s) in a checkpoint, read from each engine's own layout."""
    if config_name == "ddp":
        state = torch.load(checkpoint / "optimizer.bin", weights_only=False)["state"]
    elif config_name == "fsdp":  # a distributed checkpoint: gather its shards into one file to read it
        gathered = checkpoint / "optimizer_gathered.pt"
        dcp_to_torch_save(checkpoint / "optimizer_0", gathered)
        state = torch.load(gathered, weights_only=False)["optimizer"]["state"]
        gathered.unlink()
    else:  # DeepSpeed: each rank's ZeRO partition of the AdamW state, and the engine's own count
        state = {}
        for rank in range(NUM_PROCESSES):
            partition = torch.load(checkpoint / "pytorch_model" / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt",
                                   weights_only=False)
            state |= {(rank, key): value for key, value in
                      partition["optimizer_state_dict"]["base_optimizer_state"]["state"].items()}
        engine = torch.load(checkpoint / "pytorch_model" / "mp_rank_00_model_states.pt", weights_only=False)
        assert engine["global_steps"] == int(next(iter(state.values()))["step"])
    return {int(param_state["step"]) for param_state in state.values()}


@pytest.fixture(scope="module")
def one_process(corpus, tmp_path_factory) -> dict:
    """The reference: the same global batch (1 x 8 x 4 accumulated) in one process."""
    output_dir = tmp_path_factory.mktemp("one-process")
    config = tiny_config("tiny", corpus, output_dir, per_device_train_batch_size=NUM_PROCESSES * PER_DEVICE_BATCH,
                         gradient_accumulation_steps=ACCUMULATION, max_train_steps=MAX_STEPS, num_warmup_steps=20,
                         learning_rate=1e-3, checkpointing_steps=CHECKPOINT_STEP, hidden_dropout=0.0,
                         attention_dropout=0.0, cpu=True)
    return {"config": config, **training_function(config)}


@pytest.fixture(scope="module")
def launched(corpus, tmp_path_factory):
    """launched(config_name): that config's 6-step run on 2 processes (run once per module)."""
    runs = {}

    def run(config_name: str) -> dict:
        if config_name not in runs:
            output_dir = tmp_path_factory.mktemp(f"{config_name}-2-processes")
            log = accelerate_launch(config_name, training_options(corpus, output_dir))
            runs[config_name] = {"output_dir": output_dir, "log": log}
        return runs[config_name]

    return run


@pytest.mark.parametrize("config_name", config_params())
def test_config_trains_like_one_process(config_name, launched, one_process):
    run = launched(config_name)
    distributed_type, plugin_file = CONFIGS[config_name]
    # The plugin really was in force: the run says so, and its checkpoint has that engine's layout
    assert f"2 process(es), DistributedType.{distributed_type}, mixed precision no" in run["log"]
    if config_name == "deepspeed_zero2":
        assert "Setting accelerator to CPU" in run["log"]  # DeepSpeed's CPU accelerator, on gloo
    checkpoint = run["output_dir"] / "checkpoints" / f"step_{CHECKPOINT_STEP}"
    assert (checkpoint / plugin_file).is_file()

    # One optimizer step (and one lr step) per 4 micro-batches, with the 1-process run's losses
    losses = tensorboard_scalars(run["output_dir"], "pretrain", "train/loss")
    assert len(losses) == MAX_STEPS
    assert losses == pytest.approx(one_process["train_losses"], rel=1e-5)
    assert tensorboard_scalars(run["output_dir"], "pretrain", "train/lr") == pytest.approx(
        tensorboard_scalars(Path(one_process["config"].output_dir), "pretrain", "train/lr"), rel=1e-6
    )
    assert optimizer_steps(checkpoint, config_name) == {CHECKPOINT_STEP}
    eval_losses = tensorboard_scalars(run["output_dir"], "pretrain", "eval/loss")
    assert eval_losses == pytest.approx([one_process["eval_metrics"]["loss"]], rel=1e-5)


@pytest.mark.parametrize("config_name", config_params())
def test_config_resumes_bitwise_from_its_checkpoint(config_name, launched, corpus, tmp_path):
    run = launched(config_name)
    checkpoint = run["output_dir"] / "checkpoints" / f"step_{CHECKPOINT_STEP}"
    accelerate_launch(config_name, training_options(corpus, tmp_path, resume_from_checkpoint=checkpoint))
    resumed_losses = tensorboard_scalars(tmp_path, "pretrain", "train/loss")
    assert resumed_losses == tensorboard_scalars(run["output_dir"], "pretrain", "train/loss")[CHECKPOINT_STEP:]
    uninterrupted = load_file(run["output_dir"] / "model" / "model.safetensors")
    after_resume = load_file(tmp_path / "model" / "model.safetensors")
    assert uninterrupted.keys() == after_resume.keys()
    assert [name for name, tensor in uninterrupted.items() if not torch.equal(tensor, after_resume[name])] == []


REMOTE_CODE_LOAD = textwrap.dedent("""
    import sys

    import torch
    from transformers import AutoModelForCausalLM

    class RefuseThePackage:
        # The saved folder's own code must be enough: the repository's and the installed package's are refused
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("modeling_twotower", "twotower"):
                raise ImportError(f"{name} is not available to remote code")

    sys.meta_path.insert(0, RefuseThePackage())
    model_dir, input_file, logits_file = sys.argv[1:]
    model = AutoModelForCausalLM.from_pretrained(model_dir, trust_remote_code=True)
    assert type(model).__module__.startswith("transformers_modules."), type(model).__module__
    with torch.no_grad():
        torch.save(model(torch.load(input_file)).logits, logits_file)
""")


@pytest.mark.parametrize("config_name", config_params())
def test_saved_model_is_full_and_loads_by_remote_code(config_name, launched, one_process, tmp_path):
    run = launched(config_name)
    model_dir = run["output_dir"] / "model"
    saved = {path.name for path in model_dir.iterdir()}
    assert {"model.safetensors", "modeling_twotower.py", "configuration_twotower.py"} <= saved
    assert not [name for name in saved if name.startswith("_fsdp")]  # FSDP2's class, saved in place of ours
    assert json.loads((model_dir / "config.json").read_text())["auto_map"]["AutoModelForCausalLM"] == (
        "modeling_twotower.TwoTowerForCausalLM"
    )

    # Full weights in one file, as the 1-process run saves them: every tensor whole, the frozen probes untouched
    weights = load_file(model_dir / "model.safetensors")
    reference = load_file(Path(one_process["model_dir"]) / "model.safetensors")
    assert {name: tensor.shape for name, tensor in weights.items()} == {
        name: tensor.shape for name, tensor in reference.items()
    }  # the same tensors; the tied lm_head.decoder.weight saved once, as its source model.embed_tokens.weight
    probes = [name for name in reference if name.startswith("probes.")]
    assert probes and all(torch.equal(weights[name], reference[name]) for name in probes)
    assert all(torch.allclose(weights[name], tensor, rtol=1e-4, atol=1e-6) for name, tensor in reference.items())

    # Loaded through the package, the embeddings stay tied; the validation loss is the one both ranks evaluated
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    assert model.lm_head.decoder.weight is model.model.embed_tokens.weight
    assert torch.equal(weights["model.embed_tokens.weight"], model.lm_head.decoder.weight)
    input_ids = validation_blocks(one_process["config"], load_tokenizer(str(model_dir)))  # [blocks, block_size]
    with torch.no_grad():
        logits = model(input_ids).logits  # [blocks, block_size, vocab]
    loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), input_ids[:, 1:].flatten())
    assert [loss.item()] == pytest.approx(tensorboard_scalars(run["output_dir"], "pretrain", "eval/loss"), rel=1e-5)

    # Loaded by remote code alone (the folder's copy of the modeling files), it gives the same logits
    torch.save(input_ids, tmp_path / "input_ids.pt")
    environment = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    loaded = subprocess.run(
        [sys.executable, "-c", REMOTE_CODE_LOAD, str(model_dir), str(tmp_path / "input_ids.pt"),
         str(tmp_path / "logits.pt")],
        cwd=tmp_path, env=environment | {"HF_MODULES_CACHE": str(tmp_path / "modules")},
        capture_output=True, text=True, timeout=HANG_LIMIT_S,
    )
    assert loaded.returncode == 0, loaded.stderr[-4000:]
    assert torch.equal(torch.load(tmp_path / "logits.pt"), logits)


def test_two_machines_match_one_machine(launched, corpus, tmp_path):
    # Two launches of one process each on 127.0.0.1, node ranks 0 and 1, as on two machines sharing output_dir
    port = str(free_port())
    options = training_options(corpus, tmp_path)
    machines = [
        subprocess.Popen(
            launch_command("ddp", options, "--num_machines", "2", "--machine_rank", str(rank),
                           "--main_process_ip", "127.0.0.1", "--main_process_port", port),
            cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for rank in range(2)
    ]
    logs = [machine.communicate(timeout=HANG_LIMIT_S)[0] for machine in machines]
    assert [machine.returncode for machine in machines] == [0, 0], logs[0][-4000:] + logs[1][-4000:]
    assert "2 process(es), DistributedType.MULTI_CPU" in logs[0]

    one_machine = launched("ddp")["output_dir"]
    assert tensorboard_scalars(tmp_path, "pretrain", "train/loss") == tensorboard_scalars(
        one_machine, "pretrain", "train/loss"
    )
    two_machines = load_file(tmp_path / "model" / "model.safetensors")
    assert all(torch.equal(tensor, two_machines[name])
               for name, tensor in load_file(one_machine / "model" / "model.safetensors").items())


def test_ddp_config_without_cpu_on_a_cpu_machine_refuses_to_train_alone(corpus, tmp_path):
    # Without the training's --cpu and without GPUs, each launched process would see only itself
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: ddp.yaml trains on it")
    options = [option for option in training_options(corpus, tmp_path) if not option.startswith("--cpu=")]
    launched = subprocess.run(launch_command("ddp", options, "--main_process_port", str(free_port())),
                              cwd=REPO_ROOT, capture_output=True, text=True, timeout=HANG_LIMIT_S)
    assert launched.returncode != 0
    assert "processes" in launched.stderr and "--cpu" in launched.stderr, launched.stderr[-4000:]
    assert not (tmp_path / "model").exists()
