"""`python -m evalsuite ...` (and `torchrun ... -m evalsuite run ...`): the command line."""

from .cli import main

main()
