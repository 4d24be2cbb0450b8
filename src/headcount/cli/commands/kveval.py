"""`headcount kv-eval`: measure a KV budget (``budget.json`` of `headcount kv-budget`) beside the
full cache, the uniform window (StreamingLLM) and random full KV heads at the same memory.

Every method runs [`measure_kv_budget`][headcount.kv.measure.measure_kv_budget] (what the
retrieval study's curve runs) on the same needle prompts and LM texts;
[`method_rows`][headcount.analysis.kv_methods.method_rows] makes the table. Writes ``kv-eval.csv``
and ``kv-eval.png`` into ``--out`` through headcount's record; ``docs/kv-budgets.md`` says what
each column means.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import typer

from headcount.cli.commands import app, bounded, setting
from headcount.cli.commands.core import MODEL_HELP
from headcount.cli.commands.options import DEVICE, PRECISION
from headcount.experiments.studies.retrieval.config import BudgetSettings
from headcount.kv.budget import PREFILL_RULES, check_prefill
from headcount.runtime.bounds import EXAMPLES, SEED, Bound
from headcount.runtime.errors import HeadcountError

KV_EVAL_FILES = ("kv-eval.csv", "kv-eval.png")
#: the LM texts' seeded order (the study's ``lm_seed`` for one budget); --lm-texts and
#: --max-new-tokens default to the retrieval study's curve settings (BudgetSettings)
LM_SEED = 0
TOKENS = Bound(1, 10**7, integer=True)
#: the range the study declares for lm_texts and max_new_tokens (BudgetSettings)
STUDY_COUNT = Bound(1, 10_000, integer=True)
TASK_HELP = ("a needle-in-a-haystack task: offline/niah, a `kind: niah` task YAML (generated, or RULER-style "
             ".jsonl files)")


def _streaming_sizes(budget) -> tuple[int | None, int | None]:
    """The (sink, window) most of the budget's streaming KV heads have (None, None: none stream)."""
    sizes = Counter((s, w) for layer, (srow, wrow) in enumerate(zip(budget.sink, budget.window))
                    if budget.model_window[layer] is None
                    for s, w in zip(srow, wrow) if s is not None)
    return sizes.most_common(1)[0][0] if sizes else (None, None)


def baselines(budget, context: int, dtype: str, *, uniform: bool, random_seed: int | None) -> dict:
    """The methods to measure: the budget, the full cache, and (when asked) the uniform window
    and ``random_seed``'s random full KV heads, both at the budget's memory at ``context`` tokens
    (its own bytes over the full cache's: the same target kv-budget's --uniform / --random take),
    with the budget's streaming sink and window; each from the KV policy registry
    ([`headcount.kv.policies`][headcount.kv.policies])."""
    from headcount.kv.memory import KVBudgetSettings
    from headcount.kv.policies import make_budget
    from headcount.kv.policy import BudgetRequest

    ratio = budget.kv_bytes(context) / budget.full_bytes(context)
    sink, window = _streaming_sizes(budget)
    default = KVBudgetSettings()
    s = KVBudgetSettings(memory=min(1.0, ratio), context=context, sink=default.sink if sink is None else sink,
                         window=default.window if window is None else window, dtype=dtype)
    made = {"model": budget.meta.get("made_from", {}).get("model"), "baseline_of": "kv-eval"}

    def make(name: str, **options):
        return make_budget(name, BudgetRequest(budget.n_layers, budget.n_heads, budget.n_kv_heads, budget.head_dim,
                                               s, budget.model_window, options=options, meta=made))

    out = {"budget": budget, "full": make("full")}
    if uniform:
        out["uniform"] = make("uniform")
    if random_seed is not None:
        out["random"] = make("random", seed=random_seed)
    return out


def _positions(model, tokenizer) -> int | None:
    """The most positions the model takes (its tokenizer's limit and its config's, the smaller)."""
    limits = [getattr(tokenizer, "model_max_length", None), getattr(model.config, "max_position_embeddings", None)]
    limits = [x for x in limits if isinstance(x, int) and 0 < x < 10**8]
    return min(limits) if limits else None


def _table(rows: list[dict]) -> str:
    def num(x, fmt):
        return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, fmt)

    head = (f"{'method':<8} {'accuracy [95% Wilson]':<23} {'LM loss':>8} {'KV bytes':>12} {'ratio':>6} "
            f"{'end bytes':>12} {'prefill s':>9} {'s/token':>9} {'p vs full':>9} {'p vs unif':>9}")
    lines = [head]
    for r in rows:
        acc = f"{num(r['needle_accuracy'], '.3f')} [{num(r['needle_low'], '.2f')}, {num(r['needle_high'], '.2f')}]"
        lines.append(f"{r['method']:<8} {acc:<23} {num(r['lm_loss'], '.4f'):>8} {num(r['kv_bytes'], ','):>12} "
                     f"{num(r['kv_ratio'], '.3f'):>6} {num(r['kv_bytes_end'], ','):>12} {num(r['prefill_s'], '.4f'):>9} "
                     f"{num(r['decode_s_per_token'], '.4f'):>9} {num(r['p_vs_full'], '.3g'):>9} "
                     f"{num(r['p_vs_uniform'], '.3g'):>9}")
    return "\n".join(lines)


@app.command("kv-eval")
def kv_eval(
    model: str = typer.Option(..., "--model", "-m", help=MODEL_HELP),
    budget_path: Path = typer.Option(..., "--budget", help="budget.json of `headcount kv-budget`"),
    task: str = typer.Option("offline/niah", "--task", "-t", help=TASK_HELP),
    split: str = typer.Option(None, "--split", help="the task's split of the needle prompts (default: its validation "
                                                    "split)"),
    examples: int = typer.Option(None, "--examples", help="needle prompts (a seeded subset; default: every one of the "
                                                          "split)", callback=bounded(EXAMPLES)),
    context: int = typer.Option(None, "--context", help="tokens the cache is measured at: the LM texts' length and, for a "
                                                        "generated niah task, prompt + answer (prompts of context - "
                                                        "max-new-tokens); default: the budget's context",
                                callback=bounded(TOKENS)),
    lm_texts: int = setting(BudgetSettings, "lm_texts", "--lm-texts",
                            help="ordinary texts of --context tokens for the LM loss (the first one's prefill gives "
                                 "the measured bytes)", callback=bounded(STUDY_COUNT)),
    max_new_tokens: int = setting(BudgetSettings, "max_new_tokens", "--max-new-tokens",
                                  help="greedy tokens per needle answer", callback=bounded(STUDY_COUNT)),
    uniform: bool = typer.Option(True, "--uniform/--no-uniform", help="also the uniform window (StreamingLLM sink + "
                                                                      "window) at the budget's memory"),
    random_seed: int = typer.Option(0, "--random", help="SEED of the random full KV heads at the budget's memory",
                                    callback=bounded(SEED)),
    no_random: bool = typer.Option(False, "--no-random", help="leave the random baseline out"),
    prefill: str = typer.Option(PREFILL_RULES[0], "--prefill", help="streaming heads inside the prompt's forward pass: masked "
                                "(the sink + window mask, DuoAttention's training mask) | full (every key of the "
                                "prompt, then evicted: DuoAttention's inference and kvpress)"),
    device: str = DEVICE,
    precision: str = PRECISION,
    out: Path = typer.Option(..., "--out", "-o"),
    force: bool = typer.Option(False, "--force", help="replace an earlier kv-eval output with other inputs in --out"),
):
    """Measure a KV budget beside the full cache, the uniform window and random heads -> kv-eval.csv, kv-eval.png."""
    from dataclasses import replace

    import pandas as pd

    from headcount.analysis.kv_methods import COLUMNS, kv_eval_figure, method_rows
    from headcount.data.fingerprint import run_identity
    from headcount.data.tasks import get_task
    from headcount.data.tasks.niah import NiahTask, niah_task
    from headcount.importance.pipeline import load_for
    from headcount.kv.budget import KVBudget
    from headcount.kv.measure import lm_chunks, measure_kv_budget
    from headcount.runtime.atomic import atomic_path
    from headcount.runtime.device import resolve_runtime
    from headcount.runtime.io import prepare_out
    from headcount.runtime.progress import Progress

    check_prefill(prefill)
    budget = KVBudget.load(budget_path)
    t = get_task(task)
    if not isinstance(t, NiahTask):
        raise HeadcountError(f"kv-eval needs a needle-in-a-haystack task (kind niah), {task} is a {t.kind} task")
    spec = t.source.spec if not t.source.files else None
    context = int(budget.meta.get("bytes", {}).get("context", 0)) if context is None else context
    if context < 1:
        raise HeadcountError(f"{budget_path} states no context (bytes.context): give --context")
    if spec is not None:  # a generated task: prompt + answer fill the context, given or the budget's
        if context - max_new_tokens < 16:
            raise HeadcountError(f"--context {context} leaves prompts of {context - max_new_tokens} tokens after "
                                 f"--max-new-tokens {max_new_tokens}; a niah prompt takes at least 16")
        t = niah_task(t.name, replace(spec, lengths=(context - max_new_tokens,)), t.description, base=t.source.base)
    split = t.validation_split if split is None else split
    rt = resolve_runtime(device, precision)
    dtype = str(budget.meta.get("bytes", {}).get("dtype", "float32"))
    methods = baselines(budget, context, dtype, uniform=uniform, random_seed=None if no_random else random_seed)

    net, tokenizer, _ = load_for(model, t, "lm", device=rt)
    net.eval()
    try:
        budget.check_model(net)
    except HeadcountError as e:
        raise HeadcountError(f"{budget_path} does not fit {model}: {e}") from None
    prompts = t.examples(split, tokenizer, max_examples=examples)
    if not prompts:
        raise HeadcountError(f"task {t.name} has no {split} prompts")
    limit = _positions(net, tokenizer)
    needed = max(max(len(e.input_ids) for e in prompts) + max_new_tokens, context)
    if limit is not None and needed > limit:
        raise HeadcountError(f"kv-eval needs {needed} positions (--context {context}, the longest prompt + "
                             f"--max-new-tokens), {model} has {limit}: lower --context")
    chunks = lm_chunks(t, tokenizer, split, lm_texts, context, LM_SEED,  # the split's haystack, as the study's
                       texts=None if spec is not None else [e.prompt for e in prompts])

    identity = run_identity({"model": model, "budget": str(budget_path), "task": task, "split": split,
                             "examples": examples, "context": context, "lm_texts": lm_texts,
                             "max_new_tokens": max_new_tokens, "uniform": uniform,
                             "random": None if no_random else random_seed,
                             **({} if prefill == PREFILL_RULES[0] else {"prefill": prefill})},  # earlier outputs keep their identity
                            model, t, files=[budget_path])
    with prepare_out(out, "kv-eval", identity=identity, outputs=KV_EVAL_FILES, force=force, echo=typer.echo) as guard:
        runs, per = {}, len(prompts) + len(chunks)
        with Progress(len(methods) * per, "kv-eval", unit="inputs") as bar:
            for i, (name, b) in enumerate(methods.items()):
                def step(done, total, detail, i=i, name=name):
                    bar(i * per + done, None, f"{name}: {detail}")

                m = measure_kv_budget(net, tokenizer, b, prompts, chunks, max_new_tokens=max_new_tokens,
                                      device=rt.device, autocast=rt.autocast, progress=step, prefill=prefill)
                runs[name] = {**m, "budget": b, "context": context}
        rows = method_rows(runs)
        staging = guard.staging()
        with atomic_path(staging / "kv-eval.csv") as tmp:
            pd.DataFrame(rows, columns=list(COLUMNS)).to_csv(tmp, index=False)
        kv_eval_figure(rows, staging / "kv-eval.png",
                       title=f"{Path(str(model)).name}: {t.name}, {len(prompts)} prompts, {context:,} tokens")
        guard.commit()
    typer.echo(_table(rows))
    typer.echo(f"wrote {out}/kv-eval.csv and {out}/kv-eval.png ({len(prompts)} needle prompts, {len(chunks)} LM texts "
               f"of {context:,} tokens; p: one-sided paired sign-flip over prompts)")
