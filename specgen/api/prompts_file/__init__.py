"""Prompts files (`specgen run --prompts FILE`): their lines (items.py), the results file and
its resume rules (results.py), and running one through an engine (run.py)."""
