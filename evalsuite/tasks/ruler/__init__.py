"""RULER through evalsuite's engine, its samples made by lm-evaluation-harness's own RULER code."""
