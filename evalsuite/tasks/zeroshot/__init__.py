"""Zero-shot benchmarks under low-bit attention: the task and its view."""

# this folder's tasks: name -> "module:Class", imported when first asked for (evalsuite/registry.py)
TASKS = {"zeroshot": "evalsuite.tasks.zeroshot.task:ZeroShot"}
