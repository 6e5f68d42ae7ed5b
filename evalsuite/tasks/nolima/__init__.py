"""Non-literal needles (NoLiMa): the task, its needle sets and its view."""

# this folder's tasks: name -> "module:Class", imported when first asked for (evalsuite/registry.py)
TASKS = {"nolima": "evalsuite.tasks.nolima.task:Nolima"}
