"""An outside evalsuite plugin, installed as its own package: a task and a backend."""
