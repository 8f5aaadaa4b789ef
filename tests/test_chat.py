"""The chat-template helper builds observation ids append-only: the concatenated rollout equals the
template's rendering of the whole conversation (a locally built byte-level BPE tokenizer)."""

from __future__ import annotations

import pytest

tokenizers = pytest.importorskip("tokenizers")
transformers = pytest.importorskip("transformers")

from reference.chat import ChatTemplate  # noqa: E402

SPECIALS = ["<|im_start|>", "<|im_end|>", "<tool_response>", "</tool_response>"]
TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m['content'] }}\n</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = ["You are a helpful agent.", "What is the weather in Paris?", "I will call the weather tool.",
          "sunny, 21 degrees", "It is sunny and 21 degrees in Paris.", "Thanks! And in Rome?", "cloudy, 18 degrees"]


@pytest.fixture(scope="module")
def tok():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    t.train_from_iterator(CORPUS * 20, trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS,
                                                           initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=t, eos_token="<|im_end|>")
    fast.chat_template = TEMPLATE
    return fast


def test_append_only_rollout_equals_the_template(tok):
    chat = ChatTemplate(tok)
    messages = [{"role": "system", "content": CORPUS[0]}, {"role": "user", "content": CORPUS[1]}]
    ids = chat.prompt_ids(messages)
    turns = [(CORPUS[2], CORPUS[3]), (CORPUS[4], None)]
    for answer, tool in turns:
        sampled = chat.encode(answer) + [chat.im_end_id]        # what the engine samples, stop token kept
        ids += sampled
        messages.append({"role": "assistant", "content": answer})
        if tool is not None:
            ids += chat.observation_ids(tool, sampled)
            messages.append({"role": "tool", "content": tool})
    ids += chat.observation_ids(CORPUS[5], [chat.im_end_id], role="user")
    messages.append({"role": "user", "content": CORPUS[5]})
    assert ids == chat.prompt_ids(messages), "the append-only ids differ from the template's rendering"


def test_turn_cut_by_max_tokens_is_closed(tok):
    chat = ChatTemplate(tok)
    obs = chat.observation_ids("x", chat.encode("I will"))
    assert obs[0] == chat.im_end_id and obs[1:] == chat.observation_ids("x", [chat.im_end_id])
    newline = chat.encode("\n")
    assert obs[1:1 + len(newline)] == newline, "the newline after <|im_end|> must be part of the observation"
