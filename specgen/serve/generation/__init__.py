"""The generation thread: one queue of jobs in front of the engine (worker.py; batch_worker.py
where requests decode together), one request's turn through it (turn.py) and what it keeps
between requests (cache.py)."""
