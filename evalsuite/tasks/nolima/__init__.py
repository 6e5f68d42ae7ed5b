"""Non-literal needles (NoLiMa): the task, its needle sets and its view."""
