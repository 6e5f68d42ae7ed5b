"""The run-folder format: what a run writes and every reader reads, and nothing that runs a model.

    config.json      everything needed to rerun (records.py, record_format.py; identity.py: the run hash)
    samples.jsonl    one record per sample (records.py: appended, locked, repaired on resume)
    summary.json     derived from samples.jsonl only
    suite-*.json     a suite's result file, listing its run folders (suite_result.py)

versions.py tells which code made each of several runs; view.py is the read-only view of a run
that a task's hooks receive. The engine writes run folders through this package; analysis, the
reports, the viewer and the integrations read them through it alone, never through the engine.
"""
