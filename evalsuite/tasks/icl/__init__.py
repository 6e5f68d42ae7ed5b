"""Many-shot in-context learning: the task, its datasets and its view."""

# this folder's tasks: name -> "module:Class", imported when first asked for (evalsuite/registry.py)
TASKS = {"icl": "evalsuite.tasks.icl.task:Icl"}
