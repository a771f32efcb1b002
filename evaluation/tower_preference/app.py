from pathlib import Path

import evaluate
from evaluate.utils import launch_gradio_widget


# load the script beside this file (a Space's folder is not named after the metric)
module = evaluate.load(str(Path(__file__).with_name("tower_preference.py")))
launch_gradio_widget(module)
