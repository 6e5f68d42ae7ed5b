"""Contextual hallucination: the task and its judges."""

# this folder's tasks: name -> "module:Class", imported when first asked for (evalsuite/registry.py)
TASKS = {"hallucination": "evalsuite.tasks.hallucination.task:Hallucination"}
