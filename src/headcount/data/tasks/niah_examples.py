"""Needle-in-a-haystack examples: a seeded generator and RULER-style jsonl rows, as prompts with an
answer, for retrieval scores and the answer's loss (the tasks and batches, which re-export all of
this: [`headcount.data.tasks.niah`][headcount.data.tasks.niah]).

An example is a prompt (a template around a haystack with one needle sentence in it, then a
question) and the answer the needle holds. The generator follows the reference of Wu et al.'s
retrieval heads (nightdessert/Retrieval_Head, ``retrieval_head_detection.py``, itself from
gkamradt's LLMTest_NeedleInAHaystack): the haystack is cut to the length in the model's tokens,
the needle goes in at a depth (0 = first, 1 = last) moved back to the start of the haystack text
it falls in (the reference moves back to a period), and the answer's position in the prompt (the
"needle span" the retrieval score counts copies from) is the answer's tokens. headcount locates
that span exactly, from the characters the answer occupies (the tokenizer's offsets); the
reference searches the prompt for the first window whose token set overlaps the answer's by more
than 90% ([`find_needle_idx`][headcount.data.tasks.niah_examples.find_needle_idx], used here only for
tokenizers without offsets).

Needles (``needle``): ``passkey`` (default: "The pass key is 48213. Remember it.", 5 digits),
``digits`` (RULER's "One of the special magic numbers for calm-river is: 4712093.", 7 digits) and
``fact`` (a sentence with a question, as the reference's needles: "The best thing to do in Lisbon
is ..."). Templates (``template``): ``passkey`` (default: an instruction, the haystack, the
question and the start of the answer), ``book`` (the reference's plain prompt) and ``book-chat``
(the reference's prompt for chat models, through the tokenizer's chat template).

Without a tokenizer lengths count words. The success rules of the retrieval score are here too:
[`rouge1_recall`][headcount.data.tasks.niah_examples.rouge1_recall] (the reference's, > 0.5) and
[`exact_match`][headcount.data.tasks.niah_examples.exact_match].
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from headcount.data.tasks.tables import Table
from headcount.runtime.errors import HeadcountError

NEEDLES = ("passkey", "digits", "fact")
#: the reference's ten depths (``np.linspace(0, 100, 10)`` rounded, as fractions)
REFERENCE_DEPTHS = tuple(float(d) / 100 for d in np.round(np.linspace(0, 100, 10)))

CITIES = ("Lisbon", "Nairobi", "Oslo", "Montreal", "Kyoto", "Lima", "Dublin", "Hanoi", "Cairo", "Seville",
          "Tallinn", "Perth")
ACTIVITIES = ("walk along the river at dawn and buy warm bread", "ride a bicycle around the old harbour",
              "climb the hill behind the cathedral at sunset", "eat grilled fish at the night market",
              "read in the botanical garden on a quiet morning", "take the ferry to the islands and swim",
              "listen to jazz in a small cellar bar", "visit the paper museum and fold a crane",
              "watch the fishing boats come in at noon", "drink mint tea on a rooftop terrace",
              "follow the tram line to the last stop", "skate on the frozen lake after dinner")
ADJECTIVES = ("calm", "brave", "silver", "hollow", "quick", "amber", "quiet", "rapid", "gentle", "bitter")
NOUNS = ("river", "lantern", "falcon", "meadow", "harbor", "engine", "violin", "glacier", "orchard", "compass")


@dataclass(frozen=True)
class Template:
    """A prompt template: ``prompt`` formats ``{context}``, ``{question}`` and ``{prefix}`` (the start
    of the answer); ``chat``: the prompt is the user's message in the tokenizer's chat template;
    ``target``: how the answer continues the prompt (what the labels cover)."""

    prompt: str
    target: str = " {answer}"
    chat: bool = False


TEMPLATES = {
    "passkey": Template("There is an important piece of information hidden inside a lot of irrelevant text. Find it "
                        "and memorize it. I will quiz you about it.\n{context}\n{question} {prefix}"),
    "book": Template("{context}Based on the content of the book, Question: {question}\nAnswer:"),
    "book-chat": Template("<book>{context}</book>\nBased on the content of the book, Question: {question}\nAnswer:",
                          target="{answer}", chat=True),
}


@dataclass(frozen=True)
class NiahSpec:
    """The generator's parameters (a task YAML's ``niah:`` mapping).

    Attributes:
        needle: one of ``NEEDLES``.
        template: one of ``TEMPLATES``.
        lengths: prompt lengths in the model's tokens (at most; the haystack fills up to a few
            tokens below); example i has ``lengths[i % len(lengths)]``.
        depths: needle depths in [0, 1]; example i has ``depths[(i // len(lengths)) % len(depths)]``.
        examples: examples per split.
        digits: the pass key's / digit string's length (None: 5 for passkey, 7 for digits).
        seed: the same seed (and haystack) gives the same examples.
        haystack: ``offline`` (the fetched texts, each in its split) or a ``.txt`` file (one text per
            line; a text's split by the offline tasks' hash rule).
    """

    needle: str = "passkey"
    template: str = "passkey"
    lengths: tuple[int, ...] = (1000,)
    depths: tuple[float, ...] = REFERENCE_DEPTHS
    examples: int = 100
    digits: int | None = None
    seed: int = 0
    haystack: str = "offline"

    def __post_init__(self):
        if self.needle not in NEEDLES:
            raise HeadcountError(f"niah needle {self.needle!r} is not one of {', '.join(NEEDLES)}")
        if self.template not in TEMPLATES:
            raise HeadcountError(f"niah template {self.template!r} is not one of {', '.join(TEMPLATES)}")
        object.__setattr__(self, "lengths", _numbers(self.lengths, "lengths", int, 16, 10_000_000))
        object.__setattr__(self, "depths", _numbers(self.depths, "depths", float, 0.0, 1.0))
        _numbers([self.examples], "examples", int, 1, 1_000_000)
        _numbers([self.seed], "seed", int, 0, 2**32 - 1)
        if self.digits is not None:
            _numbers([self.digits], "digits", int, 1, 64)


def _numbers(values, name: str, kind, low, high) -> tuple:
    values = [values] if isinstance(values, (int, float)) and not isinstance(values, bool) else values
    if not isinstance(values, (list, tuple)) or not values:
        raise HeadcountError(f"niah {name} must be a number or a list of numbers")
    out = []
    for v in values:
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and (kind is float or float(v).is_integer())
        if not ok or not low <= v <= high:
            what = "an integer" if kind is int else "a number"
            raise HeadcountError(f"niah {name}: each value must be {what} in {low}..{high}, got {v!r}")
        out.append(kind(v))
    return tuple(out)


@dataclass(frozen=True)
class NiahExample:
    """One prompt with its needle.

    Attributes:
        prompt: the whole prompt (chat template applied).
        answers: what the needle holds (the reference's ``real_needle``; RULER's ``outputs``).
        target: the answer as it continues the prompt (the labels' text).
        needle: the needle sentence (None for a file that does not name it).
        length / depth: the requested length and depth (None for files).
        input_ids: the prompt's tokens; target_ids: the target's (None without a tokenizer).
        span: ``(start, end)``: the first answer's tokens in the prompt (the needle span).
    """

    prompt: str
    answers: tuple[str, ...]
    target: str
    needle: str | None = None
    length: int | None = None
    depth: float | None = None
    input_ids: tuple[int, ...] | None = None
    target_ids: tuple[int, ...] | None = None
    span: tuple[int, int] | None = None

    @property
    def answer(self) -> str:
        return " ".join(self.answers)


class _Units:
    """Text in the model's tokens, or in words without a tokenizer (lengths, offsets, cuts)."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.offsets_ok = tokenizer is None or bool(getattr(tokenizer, "is_fast", False))

    def ids(self, text: str, special: bool = False) -> list:
        if self.tok is None:
            return text.split()
        return list(self.tok(text, add_special_tokens=special, verbose=False)["input_ids"])

    def offsets(self, text: str, special: bool = False) -> list[tuple[int, int]] | None:
        if self.tok is None:
            return [(m.start(), m.end()) for m in re.finditer(r"\S+", text)]
        if not self.offsets_ok:
            return None
        enc = self.tok(text, add_special_tokens=special, return_offsets_mapping=True, verbose=False)
        return [tuple(o) for o in enc["offset_mapping"]]

    def cut(self, text: str, n: int) -> tuple[str, list[int]]:
        """``text`` cut to its first ``n`` units, and each kept unit's start character."""
        offs = self.offsets(text)
        if offs is not None:
            offs = offs[:n]
            return text[:offs[-1][1]] if offs else "", [s for s, _ in offs]
        ids = self.ids(text)[:n]  # a tokenizer without offsets: decode as the reference does
        cut = self.tok.decode(ids)
        return cut, [len(self.tok.decode(ids[:k])) for k in range(len(ids))]


def render(template: Template, context: str, question: str, prefix: str, tokenizer=None) -> str:
    """The prompt of ``template`` (a chat template's generation prompt included)."""
    text = template.prompt.format(context=context, question=question, prefix=prefix)
    if not template.chat or tokenizer is None:
        return text
    if not getattr(tokenizer, "chat_template", None):
        raise HeadcountError("the niah template book-chat needs a tokenizer with a chat template; "
                             "this model's has none: use template passkey or book")
    try:  # the template is the model's code, run in transformers' Jinja sandbox (kept as it is)
        return tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)
    except Exception as e:
        if not _template_fault(e):
            raise
        line = str(e).strip().splitlines()[0] if str(e).strip() else ""
        at = f" (line {e.lineno})" if isinstance(getattr(e, "lineno", None), int) else ""
        raise HeadcountError(f"the chat template of {chat_template_source(tokenizer)} fails{at}: {type(e).__name__}: "
                             f"{line[:200]}; fix the template, or use template passkey or book") from None


#: what a chat template's own code can raise besides Jinja's errors (a TypeError inside an
#: expression, a range the sandbox caps, a division by zero, a missing key or attribute, a macro
#: that recurses without end)
_TEMPLATE_FAULTS = (TypeError, ValueError, ArithmeticError, LookupError, AttributeError, RecursionError)


def _template_fault(e: Exception) -> bool:
    """Whether ``e`` is the chat template's fault: a Jinja error (syntax, the sandbox's
    SecurityError, ``raise_exception``'s TemplateError, an undefined name) or one of ``_TEMPLATE_FAULTS``."""
    return type(e).__module__.split(".")[0] == "jinja2" or isinstance(e, _TEMPLATE_FAULTS)


def chat_template_source(tokenizer) -> str:
    """Where ``tokenizer``'s chat template comes from, in words: the model's tokenizer and the file
    in its folder that holds the template (``chat_template.jinja``, else ``chat_template.json``,
    else ``tokenizer_config.json``), or its name (a hub id, a GGUF file) when it has no folder."""
    name = str(getattr(tokenizer, "name_or_path", "") or "")
    folder = Path(name).expanduser() if name else None
    if folder is not None and folder.is_dir():
        for file in ("chat_template.jinja", "chat_template.json", "tokenizer_config.json"):
            if (folder / file).is_file():
                return f"the model's tokenizer ({folder / file})"
    return f"the model's tokenizer ({name})" if name else "the model's tokenizer"


def make_needle(kind: str, rng: np.random.Generator, digits: int | None = None) -> tuple[str, str, str, str]:
    """``(needle, question, answer prefix, answer)`` of one needle of ``kind``.

    >>> make_needle("passkey", np.random.default_rng(0))[0]
    'The pass key is 86523. Remember it.'
    """
    def number(n: int) -> str:
        return str(int(rng.integers(1, 10))) + "".join(str(int(d)) for d in rng.integers(0, 10, n - 1))

    if kind == "passkey":
        key = number(digits or 5)
        return f"The pass key is {key}. Remember it.", "What is the pass key?", "The pass key is", key
    if kind == "digits":
        word = f"{ADJECTIVES[int(rng.integers(len(ADJECTIVES)))]}-{NOUNS[int(rng.integers(len(NOUNS)))]}"
        value = number(digits or 7)
        return (f"One of the special magic numbers for {word} is: {value}.",
                f"What is the special magic number for {word} mentioned in the provided text?",
                f"The special magic number for {word} mentioned in the provided text is", value)
    city, activity = CITIES[int(rng.integers(len(CITIES)))], ACTIVITIES[int(rng.integers(len(ACTIVITIES)))]
    return (f"The best thing to do in {city} is to {activity}.", f"What is the best thing to do in {city}?",
            f"The best thing to do in {city} is to", activity)


def generate(sentences: Sequence[str], tokenizer=None, *, spec: NiahSpec = NiahSpec(), indices=None,
             stream: int = 0) -> list[NiahExample]:
    """Examples of ``spec`` with ``sentences`` as the haystack (the texts are taken in a seeded order,
    each example from its own seeded starting point, repeated when they run out).

    Args:
        sentences: haystack texts (at least one).
        tokenizer: the model's tokenizer (lengths in its tokens, prompts tokenized, needle span);
            None: lengths in words, no tokens.
        spec: the parameters.
        indices: which of the ``spec.examples`` examples (default all); example i is the same
            whichever others are made.
        stream: a number that separates the examples of different splits.

    >>> ex = generate(["A first text.", "Another one."] * 50, spec=NiahSpec(lengths=(60,), examples=2))
    >>> len(ex[0].prompt.split()) <= 60, ex[0].answer in ex[0].prompt
    (True, True)
    """
    check_positions(spec, tokenizer)  # before any example: a length past the model's positions builds in vain
    texts = [s for s in (" ".join(str(t).split()) for t in sentences) if s]
    if not texts:
        raise HeadcountError("the niah haystack has no text")
    order = np.random.default_rng([spec.seed, stream]).permutation(len(texts))
    units, template = _Units(tokenizer), TEMPLATES[spec.template]
    out = []
    for i in (range(spec.examples) if indices is None else indices):
        rng = np.random.default_rng([spec.seed, stream, int(i)])
        length = spec.lengths[i % len(spec.lengths)]
        depth = spec.depths[(i // len(spec.lengths)) % len(spec.depths)]
        out.append(_example(texts, order, units, template, spec, length, depth, rng))
    return out


def check_positions(spec: NiahSpec, tokenizer) -> None:
    """Refuse ``spec``'s lengths when one is longer than the model's positions (the tokenizer's
    ``model_max_length``, which ``load_tokenizer`` sets from the model's config), before any
    example is made: building 10,000,000-token prompts for a 512-position model would take
    minutes to no end. Without a tokenizer (lengths in words) or without a limit, nothing to check.

    Raises:
        HeadcountError: the longest length and the model's positions, in one line.
    """
    limit = getattr(tokenizer, "model_max_length", None) if tokenizer is not None else None
    if not isinstance(limit, int) or isinstance(limit, bool) or not 0 < limit < 10**8:  # 10**8+: no limit set
        return
    longest = max(spec.lengths)
    if longest > limit:
        raise HeadcountError(f"niah length {longest} tokens is longer than the model's {limit} positions (its "
                             f"tokenizer's model_max_length); use niah lengths below {limit}, leaving room for the answer")


def _example(texts, order, units: _Units, template: Template, spec: NiahSpec, length: int, depth: float,
             rng) -> NiahExample:
    needle, question, prefix, answer = make_needle(spec.needle, rng, spec.digits)
    special = not template.chat  # a chat template writes its own special tokens
    start = int(rng.integers(len(order)))
    empty = render(template, "", question, prefix, units.tok)
    budget = length - len(units.ids(empty, special)) - len(units.ids(" " + needle)) - 1
    for _ in range(8):  # re-tokenized at the joins, a prompt may come out a few tokens long: cut more
        if budget < 1:
            raise HeadcountError(f"niah length {length} is too short for template {spec.template!r} and a "
                                 f"{spec.needle} needle (they take {length - budget} tokens); use a longer one")
        hay, bounds, starts = _haystack(texts, order, start, units, budget)
        context, at = _insert(hay, bounds, starts, needle, depth)
        prompt = render(template, context, question, prefix, units.tok)
        n = len(units.ids(prompt, special))
        if n <= length:
            break
        budget -= n - length
    else:  # pragma: no cover - a tokenizer that grows without end
        raise HeadcountError(f"could not fit a niah prompt into {length} tokens")
    target = template.target.format(answer=answer)
    if units.tok is None:
        return NiahExample(prompt, (answer,), target, needle, length, depth)
    found = prompt.find(context)
    begin = (found + at if found >= 0 else prompt.find(needle)) + needle.index(answer)
    ids = units.ids(prompt, special)
    span = _span(units, prompt, special, ids, begin, begin + len(answer), answer)
    return NiahExample(prompt, (answer,), target, needle, length, depth, tuple(ids), tuple(units.ids(target)), span)


def _haystack(texts, order, start: int, units: _Units, budget: int) -> tuple[str, list[int], list[int]]:
    """The haystack: texts from ``start`` in ``order`` (repeated when they run out) joined by spaces
    and cut to ``budget`` units; where each of its texts starts (the places a needle may go) and
    where each of its units starts."""
    chosen, chars, goal, k = [], 0, budget * 8, start
    while True:
        while chars < goal:
            chosen.append(texts[order[k % len(order)]])
            chars += len(chosen[-1]) + 1
            k += 1
        text = " ".join(chosen)
        hay, starts = units.cut(text, budget)
        if len(hay) < len(text):
            break
        goal *= 2  # fewer units than needed: take more texts
    bounds, pos = [], 0
    for t in chosen:
        if pos >= len(hay):
            break
        bounds.append(pos)
        pos += len(t) + 1
    return hay, bounds, starts


def _insert(hay: str, bounds: list[int], starts: list[int], needle: str, depth: float) -> tuple[str, int]:
    """``hay`` with ``needle`` at ``depth`` of its units (1: at the end; else at the start of the
    haystack text that holds the depth's unit, as the reference moves back to a period), and the
    needle's first character in the result."""
    if depth >= 1.0 or not hay:
        return (hay + " " + needle, len(hay) + 1) if hay else (needle, 0)
    point = starts[int(len(starts) * depth)] if starts else 0
    at = max((b for b in bounds if b <= point), default=0)
    return hay[:at] + needle + " " + hay[at:], at


def _span(units: _Units, prompt: str, special: bool, ids, begin: int, end: int, answer: str) -> tuple[int, int]:
    """The tokens of characters ``[begin, end)`` of ``prompt``; without offsets the reference's
    ``find_needle_idx`` on the answer's tokens."""
    offs = units.offsets(prompt, special)
    if offs is not None:
        hit = [i for i, (s, e) in enumerate(offs) if e > s and e > begin and s < end]
        if hit:
            return hit[0], hit[-1] + 1
    span = find_needle_idx(ids, units.ids(answer))
    if span is None:
        raise HeadcountError(f"the answer {answer[:40]!r} is not found among the prompt's tokens")
    return span


def find_needle_idx(prompt_ids: Sequence[int], needle_ids: Sequence[int]) -> tuple[int, int] | None:
    """The reference's needle span: the first window of ``len(needle_ids)`` prompt tokens whose token
    set shares more than 90% of the needle's token set (None when there is none).

    >>> find_needle_idx([5, 6, 7, 8, 9], [7, 8])
    (2, 4)
    """
    want, n = set(needle_ids), len(needle_ids)
    if not want:
        return None
    for i in range(len(prompt_ids)):
        if len(set(prompt_ids[i:i + n]) & want) / len(want) > 0.9:
            return i, i + n
    return None


# --------------------------------------------------------------------------- success rules
def _rouge_tokens(text: str) -> list[str]:
    return re.sub(r"[^a-z0-9]+", " ", text.lower()).split()


#: ``plain``: rouge_score's tokenization without its stemmer; ``porter``: with it (the reference's
#: ``RougeScorer(['rouge1'], use_stemmer=True)``, through the rouge-score package itself)
ROUGE_RULES = ("plain", "porter")


@functools.cache
def _porter_scorer():
    """The reference's scorer, built once (its Porter stemmer and tokenizer are reused per call)."""
    try:
        from rouge_score import rouge_scorer
    except ImportError:
        raise HeadcountError("rouge: porter needs the rouge-score package (pip install rouge-score)") from None
    return rouge_scorer.RougeScorer(["rouge1"], use_stemmer=True)


def rouge1_recall(reference: str, response: str, rouge: str = "plain") -> float:
    """ROUGE-1 recall of ``response`` against ``reference``. ``plain``: rouge_score's tokenization
    (lower case, runs of ``[a-z0-9]``) without its Porter stemmer; ``porter``: the reference's scorer
    (rouge_score with ``use_stemmer=True``, which also merges inflections of words longer than three
    letters: "walks" counts as "walk"). Digits, pass keys and short words score the same under both.
    The reference counts a retrieval when this exceeds 0.5.

    >>> rouge1_recall("eat a sandwich in the park", "They eat a sandwich.")
    0.5
    """
    if rouge == "porter":
        return float(_porter_scorer().score(reference, response)["rouge1"].recall)
    if rouge != "plain":
        raise HeadcountError(f"unknown rouge rule {rouge!r}; choose one of {', '.join(ROUGE_RULES)}")
    ref, got = Counter(_rouge_tokens(reference)), Counter(_rouge_tokens(response))
    total = sum(ref.values())
    return sum(min(n, got[w]) for w, n in ref.items()) / total if total else 0.0


def exact_match(answers: Sequence[str], response: str) -> bool:
    """Whether every answer appears verbatim (case aside, as RULER's ``string_match_all``) in ``response``.

    >>> exact_match(["48213"], "The pass key is 48213."), exact_match(["48213"], "4821")
    (True, False)
    """
    return all(a.strip().lower() in response.lower() for a in answers)


# --------------------------------------------------------------------------- RULER-style files
def ruler_examples(table: Table, where: str, tokenizer=None) -> list[NiahExample]:
    """Examples of a RULER-style jsonl table: ``input`` (the prompt), ``outputs`` (the answers: a
    list of strings, or one string) and, when present, ``answer_prefix`` (appended to ``input``, as
    RULER's prediction does); other fields are ignored. The needle span is the first answer's first
    occurrence in ``input``."""
    units, out = _Units(tokenizer), []
    for k in ("input", "outputs"):
        if k not in table.columns:
            raise HeadcountError(f"{where}: a niah file needs the fields input and outputs (RULER's); no {k!r}")
    prefixes = table.columns.get("answer_prefix") or [None] * len(table)
    for row, (text, outputs, prefix) in enumerate(zip(table.columns["input"], table.columns["outputs"], prefixes), 1):
        outputs = [outputs] if isinstance(outputs, str) else outputs
        if not isinstance(text, str) or not text or not isinstance(outputs, list) or not outputs or not all(
                isinstance(o, str) and o.strip() for o in outputs) or not isinstance(prefix, (str, type(None))):
            raise HeadcountError(f"{where}, line {row}: input must be text, outputs a list of answers (text), "
                                 "answer_prefix text")
        at = text.find(outputs[0])
        if at < 0:
            raise HeadcountError(f"{where}, line {row}: the answer {outputs[0][:40]!r} is not in the input")
        prompt = text + (prefix or "")
        target = ("" if prompt[-1:].isspace() else " ") + ", ".join(outputs)
        if tokenizer is None:
            out.append(NiahExample(prompt, tuple(outputs), target))
            continue
        ids = units.ids(prompt, True)
        span = _span(units, prompt, True, ids, at, at + len(outputs[0]), outputs[0])
        out.append(NiahExample(prompt, tuple(outputs), target, None, None, None, tuple(ids),
                               tuple(units.ids(target)), span))
    return out


__all__ = ["ACTIVITIES", "ADJECTIVES", "CITIES", "NEEDLES", "NOUNS", "REFERENCE_DEPTHS", "ROUGE_RULES", "TEMPLATES", "NiahExample",
           "NiahSpec", "Template", "chat_template_source", "check_positions", "exact_match", "find_needle_idx",
           "generate", "make_needle", "render", "rouge1_recall", "ruler_examples"]
