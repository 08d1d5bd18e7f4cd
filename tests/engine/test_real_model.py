"""The real chat model (SmolLM2-135M-Instruct, 4-bit, ChatML) end to end: speculation's output is
mlx-lm's plain output, greedy and seeded sampling, with the chat template applied.

Its 4-bit forward pass costs ~k times one position here (about 150 ms a position), so prompts and
outputs are short; the edit prompt makes the model copy code, so drafts are accepted.
"""

import pytest
from conftest import needs_smollm2, plain_tokens, run

from specgen.draft.drafter import make_drafter
from specgen.engine.decode.sampling import make_selector
from specgen.engine.prompts import encode_prompt

pytestmark = needs_smollm2

EDIT = "Rename `x` to `total` in this code. Reply with the code only.\n```python\ndef f(x):\n    x = x + 1\n    return x * 2\n```"
QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def smollm2(smollm2_engine):
    return smollm2_engine.loaded  # registry.load's LoadedModel of the folder, as `-m` loads it


def test_its_stop_token_ends_a_turn(smollm2):
    assert smollm2.tokenizer.convert_tokens_to_ids("<|im_end|>") in smollm2.stop_ids


@pytest.mark.parametrize("prompt,n", [(EDIT, 32), (QUESTION, 12)], ids=["edit", "question"])
def test_greedy_with_speculation_is_mlx_lm_greedy(smollm2, prompt, n):
    ids = encode_prompt(smollm2.tokenizer, prompt, chat=True)
    tokens, steps, pre = run(smollm2.model, ids, drafter=make_drafter(None), draft=8, max_tokens=n,
                             stop_tokens=smollm2.stop_ids)
    plain = plain_tokens(smollm2.model, ids, n)
    stop = next((i for i, t in enumerate(plain) if t in smollm2.stop_ids), len(plain))
    assert pre.speculation.on and tokens == plain[:stop]
    if prompt is EDIT:
        assert sum(s.accepted for s in steps) >= 10, "the copied code was not drafted"


def test_seeded_sampling_is_the_same_text_with_speculation_on_and_off(smollm2):
    ids = encode_prompt(smollm2.tokenizer, EDIT, chat=True)
    outputs = {}
    for draft in (0, 8):
        tokens, steps, _ = run(smollm2.model, ids, drafter=make_drafter(None), draft=draft, max_tokens=16,
                               stop_tokens=smollm2.stop_ids, selector=make_selector(0.5, seed=1))
        outputs[draft] = (tokens, sum(s.accepted for s in steps))
    assert outputs[0][0] == outputs[8][0] and outputs[8][1] > 0
