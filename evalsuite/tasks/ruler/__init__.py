"""RULER through evalsuite's engine, its samples made by lm-evaluation-harness's own RULER code."""

# this folder's tasks: name -> "module:Class", imported when first asked for (evalsuite/registry.py)
TASKS = {"ruler": "evalsuite.tasks.ruler.task:Ruler"}
