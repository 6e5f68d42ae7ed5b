"""Multi-needle retrieval: the task and its view."""

# this folder's tasks: name -> "module:Class", imported when first asked for (evalsuite/registry.py)
TASKS = {"needle": "evalsuite.tasks.needle.task:Needle"}
