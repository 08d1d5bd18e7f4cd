"""Structured outputs, model-free: the formats a caller may ask for (formats.py) and their
grammars compiled for a tokenizer by llguidance (grammar.py). The engine applies them
(engine/decode/constrain.py): drafts cut to what the grammar allows, forced tokens drafted, every
verified choice the one the grammar's mask leaves."""
