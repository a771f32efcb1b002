"""The study: trains model families, scores them on several texts and writes the document of its verdicts."""
