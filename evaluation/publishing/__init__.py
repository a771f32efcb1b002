"""Publishing, the last stage: a model folder with its card and report, or the metric as a Space, to the Hub."""
