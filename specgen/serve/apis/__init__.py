"""Each API's request, response and stream shapes: OpenAI chat and text completions (chat.py,
chat_stream.py), OpenAI Responses (responses.py, responses_stream.py), Anthropic Messages
(anthropic.py, anthropic_stream.py); structured outputs and tools as each asks for them
(structured.py, tools.py)."""
