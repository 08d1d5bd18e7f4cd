"""Model-free drafting: what guesses the next tokens, what it remembers, and replaying it.

n-gram tables (ngram) and the fixed predictor (predictor); the adaptive drafter (drafter) with its
copies (copies, turns, prediction), guesses (guess), acceptance estimates (acceptance), draft
lengths (length) and tuning constants (params); memory of earlier outputs (memory, memory_file);
which steps draft (schedule); replay of recorded outputs (traces, simulate).

Imports no mlx and nothing of specgen but the base modules (defaults, errors, settings, and the
records every layer reads: events, stats, store).
"""
