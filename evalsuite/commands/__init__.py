"""Commands beyond the core five (run, report, compare, check, score): one module each.

Each module defines one click command that parses its options and calls `evalsuite.api`, the
one front door to the library (as the core five in cli.py do); `COMMANDS` is what `evalsuite.cli`
adds to the command group. A module
here imports nothing heavy at import time (torch, pandas, transformers load inside the
command), so `evalsuite --help` stays fast.
"""

from __future__ import annotations

import click

COMMANDS: list[click.Command] = []

from .view import view  # noqa: E402  (each command: its import and its append)

COMMANDS.append(view)

from .trend import trend  # noqa: E402

COMMANDS.append(trend)

from .log import log_cmd  # noqa: E402

COMMANDS.append(log_cmd)

from .export import export_cmd  # noqa: E402

COMMANDS.append(export_cmd)

from .convert import convert  # noqa: E402

COMMANDS.append(convert)

from .watch import watch  # noqa: E402

COMMANDS.append(watch)
