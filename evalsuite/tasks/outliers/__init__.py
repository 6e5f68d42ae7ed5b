"""Activation outliers: the task, its streaming sketches and its view."""

# this folder's tasks: name -> "module:Class", imported when first asked for (evalsuite/registry.py)
TASKS = {"outliers": "evalsuite.tasks.outliers.task:Outliers"}
