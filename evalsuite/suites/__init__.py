"""The shipped suites (ci-smoke, diff-paper: TOML files read by engine/suites.py), their small data
files, and the script that writes those files (smoke_data.py)."""
