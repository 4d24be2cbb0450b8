"""headcount's KV budgets against kvpress's presses, on the same prompts and token ids.

Two processes. This one (headcount's venv) writes the prompts and measures headcount's side;
``bench/kvpress_side.py`` runs in the kvpress venv (``make kvpress``: kvpress 0.5.x needs
transformers < 5.3) on the same token ids and the same checkpoint directory; this one then scores
both sides' answers in one place and writes the table.

1. **Prompts** (``prompts.json``): ``--prompts`` needle prompts of the niah task (``offline/niah``:
   pass keys in the offline haystack, the reference's ten depths in turn) at ``--length`` tokens,
   validation split, template ``--template`` (``passkey``). Each is split where its question
   begins into the **context** (compressed) and the **question** (appended uncompressed), as
   kvpress's ``KVPressTextGenerationPipeline`` does; headcount's budgets see the same ids (their
   streaming heads' Lambda mask is the same in one forward or in chunks).
2. **Scores** (``scores/``): Wu et al.'s retrieval score and the long-range attention mass on
   ``--score-prompts`` training-split prompts at ``--score-length`` tokens (other haystack texts
   than the evaluated prompts), as the retrieval study scores them.
3. **headcount** at each kept fraction ``--kept`` (0.5, 0.25: the budget's measured bytes over the
   full cache's at ``--length``): ``hc-retrieval`` (the retrieval ranking, ties broken by the
   long-range mass: the study's), ``hc-long-range``, ``hc-uniform`` (every KV head streams:
   StreamingLLM) and ``hc-random`` (as many full KV heads as hc-retrieval, seed 0), sink
   ``--sink`` + window ``--window``; and ``full`` (the model's own ``DynamicCache``).
4. **kvpress** (``kvpress_side.py``, its docstring says how a kept fraction maps onto each press):
   no press, StreamingLLM, SnapKV, ExpectedAttention, Knorm, TOVA, PyramidKV, AdaKV(SnapKV) and
   DuoAttention with an on-the-fly pattern from headcount's retrieval scores of offline texts.
5. **Table** (``table.md``, ``table.csv``): per method and kept fraction the measured kept
   fraction (cache bytes after the prompt's prefill over the full cache's, per prompt, mean),
   whether the press only masks, needle accuracy with its 95% Wilson interval, the one-sided
   paired sign-flip test against the full cache (H1: fewer answered), the answer's loss
   (teacher-forced cross-entropy of the answer after the compressed prompt) and seconds per
   prompt (prefill + decoding, wall-clock).

Every (method, kept, prompt) result is saved as it finishes (``results/``); a rerun skips the
done ones (the same ``--out`` and settings; other settings are refused).

    python bench/bench_kv_peers.py --out runs/kv-peers                 # 50 prompts at 2,048 tokens: hours on 2 cores
    python bench/bench_kv_peers.py --quick --out /tmp/kv-peers         # 3 prompts at 512 tokens, two presses
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

HC_METHODS = ("hc-retrieval", "hc-long-range", "hc-uniform", "hc-random")
#: headcount's budgets with the streaming heads prefilled with full attention and evicted after
#: (``apply_kv_budget(..., prefill="full")``, as kvpress and DuoAttention's inference prefill); the
#: names above use the default masked prefill
FULL_PREFILL = "+full-prefill"
HC_FULL_PREFILL = tuple(m + FULL_PREFILL for m in HC_METHODS)
KVPRESS_METHODS = ("streaming-llm", "snapkv", "expected-attention", "knorm", "tova", "pyramidkv", "adakv-snapkv",
                   "duo-attention")
QUICK_PRESSES = ("streaming-llm", "snapkv")
MASKING = ("kvpress-adakv-snapkv", "kvpress-duo-attention")
SIDE = Path(__file__).resolve().parent / "kvpress_side.py"
#: the settings a rerun into the same --out must share (the prompts, scores and budgets depend on them)
IDENTITY = ("model", "task", "template", "prompts", "length", "score_prompts", "score_length", "sink", "window",
            "max_new_tokens", "kept")


def kvpress_python() -> Path:
    """The kvpress venv's python (``make kvpress`` builds it in ``$HEADCOUNT_KVPRESS``)."""
    root = Path(os.environ.get("HEADCOUNT_KVPRESS", Path.home() / ".cache" / "headcount-kvpress")).expanduser()
    return root / "bin" / "python"


def write_json(path: Path, doc) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)


def write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


# --------------------------------------------------------------------------- prompts
def model_dir(spec: str) -> Path:
    """The plain checkpoint directory the kvpress side loads: the offline decoder's float32 conversion."""
    from headcount.runtime.errors import HeadcountError

    if spec == "offline-decoder":
        from headcount.core.gguf import find_converted
        from headcount.core.offline_models import offline_decoder_file

        found = find_converted(offline_decoder_file())
        if found is None:
            raise HeadcountError("the offline decoder has no float32 conversion yet: run `headcount data fetch` "
                                 "(or load it once) first")
        return found
    if Path(spec).is_dir():
        return Path(spec).resolve()
    raise HeadcountError(f"--model {spec}: the kvpress side loads a local checkpoint directory (or offline-decoder)")


def split_question(ex, question: str, tokenizer) -> int:
    """The token index where the prompt's question begins (the last occurrence of ``question``)."""
    from headcount.runtime.errors import HeadcountError

    at = ex.prompt.rfind(question)
    enc = tokenizer(ex.prompt, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
    if at < 0 or list(enc["input_ids"]) != list(ex.input_ids):
        raise HeadcountError("cannot split a niah prompt into context and question (its ids are not the prompt's "
                             "tokens, or the question is not in it)")
    cut = next((i for i, (s, _) in enumerate(enc["offset_mapping"]) if s >= at), None)
    if cut is None or cut == 0:
        raise HeadcountError("the niah prompt's question has no token boundary")
    return cut


def make_prompts(task, tokenizer, args) -> list[dict]:
    from headcount.data.tasks.niah import make_needle

    question = make_needle(task.source.spec.needle, np.random.default_rng(0))[1]  # the needle kind's question
    out = []
    for i, ex in enumerate(task.examples("validation", tokenizer)):
        cut = split_question(ex, question, tokenizer)
        out.append({"id": i, "context_ids": list(ex.input_ids[:cut]), "question_ids": list(ex.input_ids[cut:]),
                    "target_ids": list(ex.target_ids), "answers": list(ex.answers), "depth": ex.depth})
    return out


# --------------------------------------------------------------------------- scores and budgets
def scores_of(name: str, model, tokenizer, args, out: Path) -> dict:
    """The retrieval or long-range scores on training-split prompts (``scores/NAME.json``, reused)."""
    from headcount.data.tasks.niah import niah_batches
    from headcount.importance.scoring import score

    path = out / "scores" / f"{name}.json"
    if not path.is_file():
        task = args.score_task
        batches = niah_batches(task, tokenizer, split="train", batch_size=1)
        # the retrieval study's settings: 12 greedy tokens, ROUGE-1 success; the mass outside the budgets' sink + window
        options = ({"max_new_tokens": 12, "success": "rouge1"} if name == "retrieval" else
                   {"sink": args.sink, "window": args.window, "kv_reduce": "max"})
        t = time.perf_counter()
        s = score(model, batches, method=name, options=options)
        s = replace(s, meta={**s.meta, "layout": shape_of(model), "seconds": time.perf_counter() - t})
        path.parent.mkdir(parents=True, exist_ok=True)
        s.save(path)
        print(f"{name} scores: {len(batches)} prompts of {args.score_length} tokens, {time.perf_counter() - t:.0f} s",
              file=sys.stderr)
    return json.loads(path.read_text())


def shape_of(model) -> dict:
    from headcount.core.gates import layout

    g = layout(model)
    return {"n_layers": int(g.n_layers), "n_heads": int(g.n_heads), "n_kv_heads": int(g.n_kv_heads),
            "head_dim": int(g.head_dim)}


def budgets(model, retrieval: dict, long_range: dict, args) -> tuple[dict, np.ndarray]:
    """``{(method, kept): KVBudget}`` and the retrieval ranking grid ``[n_layers, n_kv]`` (ranks)."""
    from headcount.experiments.studies.retrieval.jobs import kv_grid, lexicographic
    from headcount.kv.memory import KVBudgetSettings
    from headcount.kv.policies import make_budget
    from headcount.kv.policy import BudgetRequest

    shape = shape_of(model)
    L, H, K, D = shape["n_layers"], shape["n_heads"], shape["n_kv_heads"], shape["head_dim"]
    ret, lr = (np.asarray(kv_grid(doc), dtype=np.float64) for doc in (retrieval, long_range))
    rank_ret = lexicographic(ret, lr)  # the study's ranking: retrieval, ties by the long-range mass
    rank_lr = lexicographic(lr, None if np.isnan(lr).all() else ret)
    out = {}
    for kept in args.kept:
        s = KVBudgetSettings(memory=kept, context=args.length, sink=args.sink, window=args.window)

        def make(kind, grid=None, **options):
            return make_budget(kind, BudgetRequest(L, H, K, D, s, kv_scores=None if grid is None else grid.tolist(),
                                                   options=options, meta={"bench": "kv-peers"}))

        out[("hc-retrieval", kept)] = make("scores", rank_ret)
        out[("hc-long-range", kept)] = make("scores", rank_lr)
        out[("hc-uniform", kept)] = make("uniform")
        out[("hc-random", kept)] = make("random", seed=0)
    return out, rank_ret


# --------------------------------------------------------------------------- headcount's side
def _snapshot(cache):
    """A budget cache's state after the prefill: each layer's slot count and its parts' tensors (the
    cache concatenates into new tensors and never writes into old ones: references suffice)."""
    return [(layer.seen, [(p.keys, p.values) for p in layer.parts]) for layer in cache.layers]


def _put_back(cache, saved) -> None:
    for layer, (seen, parts) in zip(cache.layers, saved):
        layer.seen = seen
        for p, (k, v) in zip(layer.parts, parts):
            p.keys, p.values = k, v


def _dynamic_bytes(cache) -> int:
    return sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values)
               if isinstance(t, torch.Tensor))


def run_hc(model, budget, p: dict, max_new_tokens: int, stops: set, prefill: str = "masked") -> dict:
    """One prompt under ``budget`` (None: the full ``DynamicCache``): as the kvpress side, the context
    then the question, greedy decoding, then the answer's teacher-forced loss from the prefill's state."""
    import contextlib

    import transformers

    from headcount.kv.cache import apply_kv_budget

    context = torch.tensor([p["context_ids"]], dtype=torch.long)
    question = torch.tensor([p["question_ids"]], dtype=torch.long)
    target = list(p["target_ids"])
    n_prompt = context.shape[1] + question.shape[1]
    with torch.no_grad(), (apply_kv_budget(model, budget, prefill=prefill) if budget is not None
                           else contextlib.nullcontext()) as bc:
        cache = bc if budget is not None else transformers.DynamicCache(config=model.config)
        start = time.perf_counter()
        model(input_ids=context, cache=cache, use_cache=True, logits_to_keep=1)
        last = model(input_ids=question, cache=cache, use_cache=True).logits[0, -1]
        prefill_s = time.perf_counter() - start
        nbytes = cache.nbytes() if budget is not None else _dynamic_bytes(cache)
        saved = _snapshot(cache) if budget is not None else [(la.keys, la.values) for la in cache.layers]
        start, tokens, nxt = time.perf_counter(), [], int(last.argmax())
        for i in range(max_new_tokens):
            tokens.append(nxt)
            if nxt in stops or i == max_new_tokens - 1:
                break
            nxt = int(model(input_ids=torch.tensor([[nxt]]), cache=cache, use_cache=True).logits[0, -1].argmax())
        decode_s = time.perf_counter() - start
        if budget is not None:
            _put_back(cache, saved)
        else:
            for layer, (k, v) in zip(cache.layers, saved):
                layer.keys, layer.values = k, v
        steps = [last]
        if len(target) > 1:
            steps += list(model(input_ids=torch.tensor([target[:-1]]), cache=cache, use_cache=True).logits[0])
        loss = float(torch.nn.functional.cross_entropy(torch.stack(steps).float(), torch.tensor(target)))
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    full = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * next(model.parameters()).element_size() \
        * n_prompt
    return {"tokens": tokens, "loss": loss, "bytes": nbytes, "full_bytes": full, "prefill_s": prefill_s,
            "decode_s": decode_s, "n_new": len(tokens), "masks_only": False}


def headcount_side(model, plan: list, prompts: list, out: Path, args, stops: set) -> None:
    todo = [(name, kept, b, p) for name, kept, b in plan for p in prompts
            if not (out / "results" / f"{name}@{kept:g}" / f"{p['id']}.json").is_file()]
    print(f"headcount side: {len(todo)} runs to do", file=sys.stderr)
    for i, (name, kept, b, p) in enumerate(todo):
        r = run_hc(model, b, p, args.max_new_tokens, stops, "full" if name.endswith(FULL_PREFILL) else "masked")
        write_json(out / "results" / f"{name}@{kept:g}" / f"{p['id']}.json",
                   {"method": name, "kept": kept, "prompt": p["id"], **r})
        print(f"[{i + 1}/{len(todo)}] {name}@{kept:g} prompt {p['id']}: {r['prefill_s'] + r['decode_s']:.1f} s",
              file=sys.stderr)


# --------------------------------------------------------------------------- the table
COLUMNS = ("method", "side", "kept_target", "kept_measured", "masks_only", "kept_attended", "n", "accuracy", "low", "high",
           "p_vs_full", "answer_loss", "prefill_s", "decode_s", "seconds")


def table(out: Path, prompts: list, tokenizer, stops: set) -> list[dict]:
    """One row per results folder, in the order found (full first), answers scored here."""
    from headcount.analysis.kv_methods import wilson_interval
    from headcount.analysis.paired import paired_sign_flip_test
    from headcount.data.tasks.niah import exact_match

    by_id = {p["id"]: p for p in prompts}

    def load(folder: Path) -> dict:
        rs = {}
        for f in folder.glob("*.json"):
            r = json.loads(f.read_text())
            if r["prompt"] in by_id:
                new = r["tokens"]
                cut = next((i + 1 for i, t in enumerate(new) if t in stops), len(new))
                text = tokenizer.decode(new[:cut], skip_special_tokens=True).strip()
                rs[r["prompt"]] = {**r, "response": text, "exact": int(exact_match(by_id[r["prompt"]]["answers"], text))}
        return rs

    def order(f: Path):
        name, _, kept = f.name.rpartition("@")
        return name != "full", name.startswith("kvpress"), name != "kvpress-none", name, -float(kept or 0)

    folders = sorted((f for f in (out / "results").iterdir() if "@" in f.name), key=order) \
        if (out / "results").is_dir() else []
    runs = {f.name: load(f) for f in folders if f.is_dir()}
    full = runs.get("full@1", {})
    rows = []
    for key, rs in runs.items():
        if not rs:
            continue
        name, kept = key.rsplit("@", 1)
        ids = sorted(rs)
        won = [rs[i]["exact"] for i in ids]
        low, high = wilson_interval(sum(won), len(won))
        pairs = [i for i in ids if i in full]
        p = math.nan
        if key != "full@1" and pairs:
            p = float(paired_sign_flip_test([rs[i]["exact"] for i in pairs], [full[i]["exact"] for i in pairs],
                                            alternative="less").p_value)
        rows.append({"method": name, "side": "kvpress" if name.startswith("kvpress") else "headcount",
                     "kept_target": float(kept), "kept_measured": float(np.mean([rs[i]["bytes"] / rs[i]["full_bytes"]
                                                                                  for i in ids])),
                     "masks_only": name in MASKING,
                     # a masking press: what it lets attention read (1 - kvpress's own compression_ratio)
                     "kept_attended": float(1 - np.mean([rs[i]["press_compression"] for i in ids]))
                     if name in MASKING else math.nan, "n": len(ids), "accuracy": float(np.mean(won)), "low": low,
                     "high": high, "p_vs_full": p, "answer_loss": float(np.mean([rs[i]["loss"] for i in ids])),
                     "prefill_s": float(np.mean([rs[i]["prefill_s"] for i in ids])),
                     "decode_s": float(np.mean([rs[i]["decode_s"] for i in ids])),
                     "seconds": float(np.mean([rs[i]["prefill_s"] + rs[i]["decode_s"] for i in ids]))})
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS)
    w.writeheader()
    w.writerows(rows)
    write_text(out / "table.csv", buf.getvalue())
    write_text(out / "table.md", markdown(rows))
    return rows


def markdown(rows: list[dict]) -> str:
    def num(x, fmt):
        return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, fmt)

    lines = ["| method | kept (target) | kept (measured bytes) | accuracy [95% Wilson] | p vs full | answer loss | "
             "s / prompt |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        kept = num(r["kept_measured"], ".3f") + (f" (masks only; attends to {num(r['kept_attended'], '.3f')})"
                                                 if r["masks_only"] else "")
        lines.append(f"| {r['method']} | {num(r['kept_target'], 'g')} | {kept} | {num(r['accuracy'], '.2f')} "
                     f"[{num(r['low'], '.2f')}, {num(r['high'], '.2f')}] (n={r['n']}) | {num(r['p_vs_full'], '.3g')} | "
                     f"{num(r['answer_loss'], '.3f')} | {num(r['seconds'], '.1f')} |")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- main
def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="offline-decoder", help="offline-decoder or a local checkpoint directory")
    ap.add_argument("--task", default="offline/niah", help="a niah task: offline/niah or a `kind: niah` task YAML")
    ap.add_argument("--template", default=None, help="the niah template (default: the task's; offline/niah: passkey)")
    ap.add_argument("--prompts", type=int, default=None, help="needle prompts (default 50; quick: 3)")
    ap.add_argument("--length", type=int, default=None, help="prompt tokens (default 2048; quick: 512)")
    ap.add_argument("--score-prompts", type=int, default=None, help="prompts per scorer (default 12; quick: 2)")
    ap.add_argument("--score-length", type=int, default=None, help="their tokens (default 1024; quick: 256)")
    ap.add_argument("--kept", default="0.5,0.25", help="kept fractions of the full cache")
    ap.add_argument("--sink", type=int, default=None, help="streaming heads' sink (default 64; quick: 4)")
    ap.add_argument("--window", type=int, default=None, help="streaming heads' window (default 256; quick: 60)")
    ap.add_argument("--max-new-tokens", type=int, default=10)
    ap.add_argument("--methods", default=None,
                    help=f"comma-separated: full, {', '.join(HC_METHODS)} (each also as NAME{FULL_PREFILL}: "
                         "streaming heads prefilled with full attention, then evicted), kvpress-none and kvpress-PRESS for PRESS in "
                         f"{', '.join(KVPRESS_METHODS)} (default: all; quick: full, hc-retrieval, hc-uniform, "
                         f"kvpress-none, kvpress-streaming-llm, kvpress-snapkv)")
    ap.add_argument("--require-full", type=float, default=0.5,
                    help="stop after the full cache when it answers fewer than this share of the prompts (a format "
                         "on which the full model fails says nothing)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads in each process")
    ap.add_argument("--quick", action="store_true", help="3 prompts at 512 tokens, two presses")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    q = a.quick
    for name, full, quick in (("prompts", 50, 3), ("length", 2048, 512), ("score_prompts", 12, 2),
                              ("score_length", 1024, 256), ("sink", 64, 4), ("window", 256, 60)):
        if getattr(a, name) is None:
            setattr(a, name, quick if q else full)
    a.kept = sorted({float(k) for k in a.kept.split(",")}, reverse=True)
    if a.methods is None:
        a.methods = (["full", "hc-retrieval", "hc-uniform", "kvpress-none", *(f"kvpress-{m}" for m in QUICK_PRESSES)]
                     if q else ["full", *HC_METHODS, *HC_FULL_PREFILL, "kvpress-none",
                                *(f"kvpress-{m}" for m in KVPRESS_METHODS)])
    else:
        a.methods = [m.strip() for m in a.methods.split(",") if m.strip()]
    return a


def check_args(a) -> None:
    from headcount.runtime.errors import HeadcountError

    known = {"full", *HC_METHODS, *HC_FULL_PREFILL, "kvpress-none", *(f"kvpress-{m}" for m in KVPRESS_METHODS)}
    bad = [m for m in a.methods if m not in known]
    if bad:
        raise HeadcountError(f"--methods: unknown {bad[0]!r}; methods: {', '.join(sorted(known))}")
    if any(not 0 < k < 1 for k in a.kept):
        raise HeadcountError(f"--kept: fractions in (0, 1), got {a.kept}")
    for name in ("prompts", "length", "score_prompts", "score_length", "max_new_tokens", "threads"):
        if getattr(a, name) < 1:
            raise HeadcountError(f"--{name.replace('_', '-')} must be at least 1")


def main(argv=None) -> int:
    from headcount.runtime.errors import HeadcountError

    try:
        return run(parse(argv))
    except HeadcountError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def run(a) -> int:
    from headcount.data.tasks import get_task
    from headcount.data.tasks.niah import NiahTask, niah_task, stop_ids
    from headcount.importance.pipeline import load_for
    from headcount.runtime.device import resolve_runtime
    from headcount.runtime.errors import HeadcountError

    check_args(a)
    torch.set_num_threads(a.threads)
    out = a.out
    identity = {k: getattr(a, k) for k in IDENTITY}
    settings = out / "settings.json"
    if settings.is_file() and json.loads(settings.read_text()) != identity:
        raise HeadcountError(f"{out} holds a run with other settings ({settings}): use another --out")
    t = get_task(a.task)
    if not isinstance(t, NiahTask) or t.source.spec is None or t.source.files:
        raise HeadcountError(f"--task {a.task}: a generated needle-in-a-haystack task (kind niah) is needed")
    spec = t.source.spec if a.template is None else replace(t.source.spec, template=a.template)
    task = niah_task(t.name, replace(spec, lengths=(a.length,), examples=a.prompts), base=t.source.base)
    a.score_task = niah_task(t.name, replace(spec, lengths=(a.score_length,), examples=a.score_prompts),
                             base=t.source.base)
    folder = model_dir(a.model)
    model, tokenizer, _ = load_for(a.model, task, "lm", device=resolve_runtime("cpu"))
    model.eval()
    stops = set(stop_ids(tokenizer))
    out.mkdir(parents=True, exist_ok=True)
    write_json(settings, identity)

    prompts_path = out / "prompts.json"
    if prompts_path.is_file():
        doc = json.loads(prompts_path.read_text())
    else:
        prompts = make_prompts(task, tokenizer, a)
        doc = {"format": "headcount.kv-peers-prompts", "version": 1, "model_dir": str(folder), "length": a.length,
               "max_new_tokens": a.max_new_tokens, "stop_ids": sorted(stops), "kept": a.kept, "prompts": prompts}
    need_scores = any(m in a.methods for m in (*HC_METHODS, *HC_FULL_PREFILL, "kvpress-duo-attention"))
    plan = [("full", 1.0, None)] if "full" in a.methods else []
    if need_scores:
        retrieval = scores_of("retrieval", model, tokenizer, a, out)
        long_range = scores_of("long-range", model, tokenizer, a, out)
        made, rank = budgets(model, retrieval, long_range, a)
        for (name, kept), b in made.items():  # what each budget is (made again on a rerun: deterministic)
            b.save(out / "budgets" / f"{name}@{kept:g}.json")
        n_kv = rank.size
        doc["duo"] = {"pattern": rank.tolist(), "sink": a.sink, "recent": a.window,
                      "source": "headcount's retrieval ranking (retrieval scores of offline texts, ties by long-range)",
                      "by_kept": {f"{k:g}": {"n_streaming": n_kv - made[("hc-retrieval", k)].n_full,
                                             "head_compression_ratio": (n_kv - made[("hc-retrieval", k)].n_full) / n_kv}
                                  for k in a.kept}}
        plan += [(name + rule, kept, made[(name, kept)]) for rule in ("", FULL_PREFILL) for name in HC_METHODS
                 if name + rule in a.methods for kept in a.kept]
    write_json(prompts_path, doc)
    prompts = doc["prompts"]

    # the full cache first: a prompt format on which the full model fails says nothing
    headcount_side(model, plan[:1], prompts, out, a, stops)
    rows = {r["method"]: r for r in table(out, prompts, tokenizer, stops)}
    if "full" in rows:
        acc = rows["full"]["accuracy"]
        print(f"full cache: {acc:.2f} of {rows['full']['n']} prompts answered", file=sys.stderr)
        if acc < a.require_full:
            raise HeadcountError(f"the full cache answers {acc:.2f} of the prompts (< --require-full {a.require_full}): "
                                 "this prompt format says nothing about compression")
    headcount_side(model, plan[1:], prompts, out, a, stops)
    presses = [m[len("kvpress-"):] for m in a.methods if m.startswith("kvpress-")]
    if presses:
        python = kvpress_python()
        if not python.is_file():
            print(f"kvpress venv absent ({python}): run `make kvpress`; the kvpress methods are left out",
                  file=sys.stderr)
        else:
            env = {**os.environ, "OMP_NUM_THREADS": str(a.threads)}
            env.pop("PYTHONPATH", None)
            done = subprocess.run([str(python), str(SIDE), "--prompts", str(prompts_path), "--out", str(out),
                                   "--methods", ",".join(presses), "--threads", str(a.threads)], env=env)
            if done.returncode:
                raise HeadcountError(f"the kvpress side failed (exit {done.returncode}; its output is above)")
    rows = table(out, prompts, tokenizer, stops)
    print(markdown(rows))
    print(f"wrote {out}/table.md and {out}/table.csv ({len(prompts)} prompts of {a.length} tokens)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
