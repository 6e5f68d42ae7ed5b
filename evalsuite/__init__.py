"""evalsuite: evaluation harness for long-context language models (DIFF vs baseline)."""

__version__ = "0.1.0"
