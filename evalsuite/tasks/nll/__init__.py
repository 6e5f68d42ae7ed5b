"""NLL by position (the paper's Figure 4): the task and its view."""

# this folder's tasks: name -> "module:Class", imported when first asked for (evalsuite/registry.py)
TASKS = {"nll": "evalsuite.tasks.nll.task:Nll"}
