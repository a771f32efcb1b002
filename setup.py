from setuptools import setup

setup(
    name="twotower",
    version="0.1.0",
    packages=["modeling_twotower", "twotower.training", "twotower.evaluation"],
    package_dir={"twotower.training": "training", "twotower.evaluation": "evaluation"},
)
