"""Needle-in-a-haystack test helpers: a small haystack, a word-piece tokenizer that knows its words
(digits split into pieces, offsets available, no special tokens added), and a tiny Llama with it.

Nothing here needs the fetched offline data or the network.
"""

from __future__ import annotations

import re
from pathlib import Path

import transformers

from headcount.data.tasks.niah import ACTIVITIES, ADJECTIVES, CITIES, NOUNS, TEMPLATES

#: the haystack of the tests: short review-like sentences
SENTENCES = [
    "The movie was long and dull.", "A fine cast cannot save a weak plot.", "Still, the music is good!",
    "I would not watch it again.", "The camera work is quite slow.", "Some scenes are very dark.",
    "The ending came too fast.", "Many people left before the end.", "This story has no heart.",
    "The old actor gives a new life to the film.", "It is a small film with big ideas.",
    "The light in the last scene is lovely.",
]
SPECIAL = ["[PAD]", "[UNK]", "[EOS]"]
#: a chat template in the tokenizer's words (the book-chat template needs one)
CHAT_TEMPLATE = "{% for m in messages %}< user > {{ m['content'] }} < assistant >{% endfor %}"


def _words(*texts: str) -> list[str]:
    return sorted({w for t in texts for w in re.findall(r"[a-z]+|[^a-z0-9\s]", t.lower())})


def niah_tokenizer(extra: tuple[str, ...] = ()) -> transformers.PreTrainedTokenizerFast:
    """A fast word-piece tokenizer over the words of ``SENTENCES``, the needles and the templates
    (lower-cased; digits as ``4 ##8 ##2 ...``; no special tokens added; ``[EOS]`` ends a sequence)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    texts = [*SENTENCES, *CITIES, *ACTIVITIES, *ADJECTIVES, *NOUNS, *(t.prompt for t in TEMPLATES.values()), *extra,
             ("the pass key is remember it what is the special magic numbers number for mentioned in provided text "
              "best thing to do one of - : ? . < > user assistant book answer based on content question")]
    digits = [str(d) for d in range(10)] + [f"##{d}" for d in range(10)]
    vocab = {w: i for i, w in enumerate(SPECIAL + digits + _words(*texts))}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]",
                                                eos_token="[EOS]")
    fast.model_max_length = 512
    return fast


def tiny_niah_model(tokenizer, seed: int = 3, positions: int = 512):
    """A tiny random Llama (4 query heads on 2 KV heads, 3 layers) whose vocabulary is ``tokenizer``'s."""
    from conftest import tiny_model

    return tiny_model("llama", head="lm", seed=seed, vocab_size=len(tokenizer), max_position_embeddings=positions,
                      pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None)


def save_niah_checkpoint(path: Path, seed: int = 3, positions: int = 512) -> Path:
    """The tiny Llama and its tokenizer saved in ``path`` (what ``--model`` takes)."""
    tok = niah_tokenizer()
    tiny_niah_model(tok, seed, positions).save_pretrained(path)
    tok.save_pretrained(path)
    return Path(path)


def write_niah_task(folder: Path, **params) -> Path:
    """A ``kind: niah`` task YAML in ``folder`` over ``SENTENCES`` (``haystack.txt``), with ``params``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "haystack.txt").write_text("\n".join(SENTENCES) + "\n")
    body = {"lengths": [60], "depths": [0, 0.5, 1], "examples": 6, "haystack": "haystack.txt", **params}
    lines = "".join(f"  {k}: {v}\n" for k, v in body.items())
    (folder / "niah.yaml").write_text(f"name: tiny-niah\nkind: niah\nniah:\n{lines}")
    return folder / "niah.yaml"


def self_answered_niah(folder: Path, new_tokens: int, examples: int = 4, batch_size: int = 2):
    """``(model, batches)``: a tiny niah model and validation batches of a generated task whose every
    answer is what the full model says in ``new_tokens`` greedy tokens (full accuracy 1, so that a
    cut of heads can lower it)."""
    from dataclasses import replace

    from headcount.data.tasks import get_task
    from headcount.data.tasks.niah import niah_batches
    from headcount.importance.retrieval import retrieve

    tok = niah_tokenizer()
    model = tiny_niah_model(tok)
    task = get_task(str(write_niah_task(folder, examples=examples)))
    batches = niah_batches(task, tok, split="validation", batch_size=batch_size)
    for b in batches:
        b.examples = [replace(e, answers=(b.decode(retrieve(model, e, b.stop_ids, new_tokens)[1]).strip(),))
                      for e in b.examples]
    return model, batches
