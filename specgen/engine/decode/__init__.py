"""One sequence's decoding: the loop (loop.py), the rules every loop runs a sequence by
(sequence.py), token selection (sampling.py), rollback (rollback.py), grammars (constrain.py) and
eager passes (eager.py). The batch engine (engine/batch/) runs the same Sequence rules."""
