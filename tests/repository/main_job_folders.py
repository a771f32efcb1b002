"""The folders the main job (scripts/train_tiny.sh) leaves, made by its own three commands (in this process, with
absolute paths as the script passes them) in seconds, for the docs' examples to run against: its recipes on a slice
of its corpus, for 2 steps of pretraining and one short probe epoch."""

from pathlib import Path

from twotower.evaluation.scoring import score
from twotower.training import train

REPO = Path(__file__).resolve().parents[2]
# The repository folders the examples read (the shipped corpus, the metric's folder for evaluate.load).
REPOSITORY_FOLDERS = ("data", "evaluation")
# How much of each text the commands read: a slice of each keeps every command to seconds.
SLICE_CHARACTERS = 30_000


def write_slice(source: Path, target: Path):
    """The first SLICE_CHARACTERS characters of `source`, cut at a line's end."""
    with open(source, encoding="utf-8") as handle:
        text = handle.read(SLICE_CHARACTERS)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text.rsplit("\n", 1)[0] + "\n", encoding="utf-8")


def make_main_job_folders(root: Path, shared_data: Path) -> Path:
    """Under `root`: `repository/`, laid out as a clone after the main job (the repository folders the examples read,
    linked, and the main job's outputs/tiny/{pretrain,probe,report}), and `shared/data/wikitext-2/`, slices of the
    shared WikiText-2 that the docs' commands read as ../shared/data. Returns the repository folder."""
    repository = root / "repository"
    repository.mkdir()
    for folder in REPOSITORY_FOLDERS:
        (repository / folder).symlink_to(REPO / folder)
    wikitext = root / "shared" / "data" / "wikitext-2"
    for split in ("train", "valid", "test"):
        write_slice(shared_data / "wikitext-2" / f"{split}.txt", wikitext / f"{split}.txt")
    corpus = root / "tiny-shakespeare"
    for split in ("train", "valid"):
        write_slice(REPO / "data" / "tiny-shakespeare" / f"{split}.txt", corpus / f"{split}.txt")
    texts = ["--train_file", str(corpus / "train.txt"), "--validation_file", str(corpus / "valid.txt")]
    quiet = ["--disable_tqdm", "true"]
    out = repository / "outputs" / "tiny"
    train.main(["--recipe", "tiny", "--output_dir", str(out / "pretrain"), *texts,
                "--max_train_steps", "2", "--eval_steps", "2", "--max_eval_blocks", "4", *quiet])
    train.main(["--recipe", "tiny_probe", "--output_dir", str(out / "probe"), "--pretrained_model",
                str(out / "pretrain" / "model"), *texts,
                "--max_train_blocks", "32", "--num_train_epochs", "1", "--max_eval_blocks", "4", *quiet])
    score.main(["--model_dir", str(out / "probe" / "model"), "--output_dir", str(out / "report"),
                "--validation_file", str(corpus / "valid.txt"), *quiet])
    return repository
