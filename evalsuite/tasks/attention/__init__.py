"""Attention allocation (the paper's Table 3): the task and its view."""

# this folder's tasks: name -> "module:Class", imported when first asked for (evalsuite/registry.py)
TASKS = {"attention": "evalsuite.tasks.attention.task:Attention"}
