"""Where an explorer page's numbers come from: a run directory ([`from_run`][headcount.experiments.explorer.sources.from_run]) or a model and
a task with optional score and mask files ([`from_model`][headcount.experiments.explorer.sources.from_model]); and the attention examples
([`attention_examples`][headcount.experiments.explorer.sources.attention_examples]) both compute with [`headcount.core.attention.attention_maps`][headcount.core.attention.attention_maps].
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from headcount.experiments.explorer.data import (
    DEFAULT_EXAMPLES,
    EXAMPLES_SHOWN,
    MAX_TOKENS,
    add_levels,
    add_steps,
    add_quantity,
    add_seed_summaries,
    attention_block,
    finish,
    new_page,
    seed_group,
)
from headcount.runtime.errors import HeadcountError
from headcount.runtime.jsonfile import read_json

#: parameters that mark a mask as a drawn control (random or bad), not a result to explore
_CONTROLS = {"kind": ("random", "bad"), "order": ("random",)}


#: Importance methods in words (others: ``<method> importance``).
METHODS = {"gradient": "gradient importance", "gradient-token": "gradient importance",
           "magnitude": "weight-magnitude importance", "retrieval": "retrieval score",
           "long-range": "long-range attention mass"}

#: Objectives in words.
OBJECTIVES = {"mlm": "MLM", "task": "task", "embedding": "embedding"}


def _short_task(task) -> str:
    """``offline/tweets`` -> ``tweets``: the task as the page names it (a task file: its ``name``).

    >>> _short_task("offline/tweets"), _short_task("glue/sst2"), _short_task(None)
    ('tweets', 'sst2', '')
    """
    if not task:
        return ""
    task = str(task)
    if task.endswith((".yaml", ".yml")):
        task = _task_file_name(task)
    return task.rstrip("/").rsplit("/", 1)[-1]


@functools.lru_cache(maxsize=64)
def _task_file_name(path: str) -> str:
    """The ``name`` of a task file (its file name when it cannot be read)."""
    try:
        from headcount.data.tasks import get_task

        return get_task(path).name
    except Exception:  # noqa: BLE001  (a label only: the file may have moved since the run)
        return Path(path).stem


def describe(what: str, name: str, kind: str = "", params: dict | None = None, data: dict | None = None,
             study: str = "") -> str:
    """A quantity's name by method, task and seed, from its job (``name``, ``kind``, ``params``) and
    its file (``data``: ``method``, ``objective``, ``task``), never by job or file path: ``task
    gradient importance (fine-tuned), tweets, seed 1``. ``what``: ``score``, ``mask``, ``steps``,
    ``rules``, ``cnn`` (then ``params["examples"]``), ``entropy``, ``levels``. The job name when
    nothing is known of it.

    >>> describe("score", "transfer/task-scores/tweets/seed1/fine-tuned", "score",
    ...          {"method": "gradient-token", "objective": "task", "task": "offline/tweets"})
    'task gradient importance (fine-tuned), tweets, seed 1'
    >>> describe("score", "transfer/mlm-scores/tweets", "transfer-mlm-score", {"method": "gradient-token", "task": "offline/tweets"})
    'MLM gradient importance (pre-trained), tweets'
    >>> describe("mask", "lottery/prune/offline/tweets/seed2", "prune", {"task": "offline/tweets"}, study="demo")
    'lottery: good mask (iterative pruning), tweets, seed 2'
    >>> describe("score", "my-job", "custom")
    'my-job'
    """
    params, data = params or {}, data or {}
    task = _short_task(data.get("task") or params.get("task") or "")
    _, seed = seed_group(name)
    seed = seed if seed is not None else params.get("seed") if isinstance(params.get("seed"), int) else None
    state = ""
    last = name.rstrip("/").rsplit("/", 1)[-1]
    if last in ("fine-tuned", "pre-trained"):
        state = last
    text = ""
    if what == "score":
        method = data.get("method") or params.get("method")
        objective = data.get("objective") or params.get("objective") or ("mlm" if "mlm" in kind else None)
        if method or objective:
            text = " ".join(x for x in (OBJECTIVES.get(objective, objective), METHODS.get(method, f"{method} importance"
                                                                                             if method else "importance")) if x)
            if objective == "mlm" and not state and seed is None and kind.startswith("transfer"):
                state = "pre-trained"
            if objective == "task" and state == "pre-trained":
                state = "pre-trained encoder"  # a task head fitted on the frozen encoder
            text += f" ({state})" if state else ""
    elif what in ("mask", "steps"):
        if kind == "prune":
            text = "good mask (iterative pruning)" if what == "mask" else "pruning step that removed the head"
        elif kind.endswith("subnetwork") and params.get("kind") == "super":
            text = "super-survivors (kept by every seed)"
        elif what == "steps":
            text = "pruning step that removed the head"
    elif what in ("rules", "cnn"):
        text = ("pattern class (rules)" if what == "rules"
                else f"pattern class (CNN, commonest over {params.get('examples')} examples)")
    elif what == "entropy":
        text = "attention entropy (fine-tuned model)"
    elif what == "levels":
        order = last[:-2] if last.endswith("-*") else ""
        if not task and name.count("/") >= 2:  # the transfer study's mask/<task>/<order>-<level>
            task = name.rstrip("/").split("/")[-2]
        text = f"pruning level that removed the head{f', by {OBJECTIVES.get(order, order)} importance' if order else ''}"
    if not text:
        return {"mask": f"kept: {name}", "steps": f"removed at step: {name}", "levels": f"removed at level: {name}",
                "entropy": f"attention entropy: {name}"}.get(what, name)
    part = name.split("/", 1)[0] if study == "demo" and "/" in name else ""
    return (f"{part}: " if part else "") + text + (f", {task}" if task else "") + (f", seed {seed}" if seed is not None else "")


def _is_control(params: dict) -> bool:
    return any(params.get(k) in values for k, values in _CONTROLS.items())


def _pattern_quantities(page: dict, name: str, patterns: dict, label=None) -> None:
    """The pattern grids of a ``patterns.json`` (``label(what, examples)``: their names; default ``pattern (...): name``)."""
    label = label or (lambda what, n=None: f"pattern (rules): {name}" if what == "rules"
                      else f"pattern (CNN, commonest over {n} examples): {name}")
    from headcount.analysis.patterns import CLASSES

    labels = np.asarray(patterns.get("labels") or [], dtype=object)
    if labels.size:
        cats = list(CLASSES) + sorted({str(v) for v in labels.ravel()} - set(CLASSES))
        add_quantity(page, label("rules"), [[cats.index(str(v)) for v in row] for row in labels],
                     kind="pattern", categories=cats, key=name)
    ids = patterns.get("cnn_example_ids")
    if ids:  # [examples, layers, heads]: the commonest class over the examples
        cats = list(patterns.get("cnn_classes") or CLASSES)
        arr = np.asarray(ids, dtype=int)
        counts = np.stack([(arr == c).sum(0) for c in range(len(cats))])
        add_quantity(page, label("cnn", arr.shape[0]), counts.argmax(0), kind="pattern", categories=cats, key=name)


_FILES = ("scores.json", "mask.json", "patterns.json", "budget.json")


def _budget_quantity(page: dict, r) -> bool:
    """A job's ``budget.json`` (a KV budget, ``headcount.kv.budget``) as a ``pattern`` quantity:
    each query head shows its KV head's budget (``full cache`` or ``sink S + window W``). False,
    and nothing added, for a budget that treats every KV head alike (the full cache, a uniform
    window) or that does not fit the page's grid."""
    from headcount.runtime.jsonfile import read_json

    b = read_json(r.dir / "budget.json", "budget")
    sinks, windows = b.get("sink") or [], b.get("window") or []
    cells = [[("full cache" if s is None else f"sink {s} + window {w}") for s, w in zip(rs, rw)]
             for rs, rw in zip(sinks, windows)]
    n_kv = len(cells[0]) if cells else 0
    if len(cells) != page["layers"] or not n_kv or page["heads"] % n_kv or len({c for row in cells for c in row}) < 2:
        return False
    cats = ["full cache"] + sorted({c for row in cells for c in row} - {"full cache"})
    group = page["heads"] // n_kv
    grid = [[cats.index(row[h // group]) for h in range(page["heads"])] for row in cells]
    made = b.get("made_from") or {}
    mode, memory = made.get("mode"), made.get("memory")
    name = (f"KV budget: full cache or streaming ({mode}" + (f", memory {memory:g}" if isinstance(memory, (int, float))
                                                              else "") + f", {b.get('n_full', '?')} full KV heads)")
    add_quantity(page, name, grid, kind="pattern", categories=cats, key=r.name)
    return True


def _results(store) -> list:
    """The finished jobs (plan order) that wrote a grid, or that may hold a model: only their
    ``result.json`` is read (a large study has many results the page does not need)."""
    out = []
    for e in store.plan["jobs"]:
        d = store.job_dir(e["key"])
        if store.is_done(e["key"]) and (e["kind"] == "finetune" or any((d / f).is_file() for f in _FILES)):
            out.append(store.load(e["key"], e["name"]))
    return out


def _layout_of(results) -> tuple[int, int] | None:
    for r in results:
        for file, key in (("scores.json", "heads"), ("mask.json", "heads"), ("patterns.json", "labels")):
            if (r.dir / file).is_file():
                grid = np.asarray(read_json(r.dir / file, "result file").get(key) or [], dtype=object)
                if grid.ndim == 2 and grid.size:
                    return grid.shape
    return None


def from_run(run, *, examples: int = DEFAULT_EXAMPLES, job: str | None = None, device=None,
             attention: bool = True) -> dict:
    """The page model of a run directory (a transfer or lottery study, or any study whose jobs
    write ``scores.json``, ``mask.json`` or ``patterns.json``).

    Score grids (each job's ``scores.json``), masks (``mask.json``; drawn random/bad controls
    left out), survival across seeds, the smallest pruning level that removed each head (masks
    of one family at several ``level`` params), pattern classes (``patterns.json``: rules, CNN).
    Attention: the model of the finetune job ``job`` (default: the first finished one that kept
    its ``model/`` and had no mask) on ``examples`` dev examples of its task; none, with a note,
    when the run kept no such model, or ``attention=False`` (the report's page: it reads saved
    results only, never a model).

    Raises:
        HeadcountError: not a run directory, or one without a finished score, mask or pattern result.
    """
    from headcount.experiments.runner import RunStore

    EXAMPLES_SHOWN.check(examples, "--examples")
    root = Path(run).expanduser()
    if not root.is_dir():
        raise HeadcountError(f"{run} is not a directory (give a study's run directory)")
    store = RunStore(root)
    study = store.manifest.get("study", "study")
    results = _results(store)
    shape = _layout_of(results)
    if shape is None:
        raise HeadcountError(f"{run} has no finished score, mask or pattern results to explore "
                             f"({sum(store.is_done(e['key']) for e in store.plan['jobs'])} of its {len(store.plan['jobs'])} jobs "
                             "finished); run the study first")
    page = new_page(*shape, title=_run_name(store) or f"{root.name} ({study} study)",
                    source={"kind": "run", "run": str(root), "study": study})
    families: dict[str, dict[float, dict]] = {}
    labels: dict[str, str] = {}  # family -> its name on the page
    left_out = 0
    alike = 0  # KV budgets that treat every KV head alike (the full cache, a uniform window)
    steps_unknown = False  # a pruned mask (it has a trace) written before masks recorded removed_at_step
    for r in results:
        if (r.dir / "scores.json").is_file():
            s = read_json(r.dir / "scores.json", "scores")
            add_quantity(page, describe("score", r.name, r.kind, r.params, s, study), s.get("heads"), s.get("mlps"),
                         kind="score", key=r.name)
        if (r.dir / "mask.json").is_file():
            m = read_json(r.dir / "mask.json", "mask")
            if _is_control(r.params):
                left_out += 1
            elif isinstance(r.params.get("level"), (int, float)):
                level = float(r.params["level"])
                tail = f"{level:g}"
                family = r.name[:-len(tail)] + "*" if r.name.endswith(tail) else f"{r.name} (levels)"
                families.setdefault(family, {})[level] = m
                labels.setdefault(family, describe("levels", family, r.kind, r.params, m, study))
            else:
                add_quantity(page, describe("mask", r.name, r.kind, r.params, m, study), m.get("heads"), m.get("mlps"),
                             kind="mask", key=r.name)
                if isinstance(m.get("removed_at_step"), dict):  # iterative pruning (the lottery's good masks)
                    add_steps(page, describe("steps", r.name, r.kind, r.params, m, study), m["removed_at_step"],
                              key=r.name)
                elif (r.dir / "trace.csv").is_file():
                    steps_unknown = True
        if (r.dir / "budget.json").is_file() and not _budget_quantity(page, r):
            alike += 1
        if (r.dir / "patterns.json").is_file():
            _pattern_quantities(page, r.name, read_json(r.dir / "patterns.json", "patterns"),
                                lambda what, n=None, r=r: describe(what, r.name, r.kind, {**r.params, "examples": n},
                                                                   None, study))
    for family, masks in families.items():
        add_levels(page, family, masks, label=labels[family])
    add_seed_summaries(page)
    if left_out:
        page["notes"].append(f"{left_out} masks drawn as random or bad controls are left out.")
    if alike:
        page["notes"].append(f"{alike} KV budgets that give every KV head the same cache (the full cache, a uniform "
                             "window) are left out.")
    if steps_unknown:
        page["notes"].append("Some pruned masks were written by an earlier headcount: they record their final heads, "
                             "not the pruning step that removed each head.")
    model_job = _model_job(store, results, job) if attention else None
    if not attention:
        page["notes"].append("No attention examples on this page (the report reads saved results only): "
                             "`headcount explore RUN --out explore-full.html` adds them.")
    elif model_job is None:
        page["notes"].append("No attention examples: the run keeps no fine-tuned model (a finetune job's model/ folder).")
    else:
        task = model_job.params.get("task")
        ex = attention_examples(str(model_job.dir / "model"), task, examples=examples, device=device,
                                layout=(page["layers"], page["heads"]))
        kv_groups(page, ex.get("kv_heads"))
        page["attention"] = attention_block(f"{model_job.name} on {ex['n']} dev examples of {ex['task']}",
                                            ex["tokens"], ex["maps"], ex["note"])
        add_quantity(page, describe("entropy", model_job.name, model_job.kind, model_job.params, None, study),
                     ex["entropy"], kind="score", key=model_job.name)
    return finish(page)


def _run_name(store) -> str | None:
    """The ``name:`` of the run's config, if it has one."""
    from headcount.runtime.yamlfile import load_yaml_with_lines

    try:
        doc, _ = load_yaml_with_lines(store.config_text, "study.yaml")
    except HeadcountError:  # the title falls back to the folder's name
        return None
    return str(doc["name"]) if isinstance(doc, dict) and doc.get("name") else None


def _model_job(store, results, job: str | None):
    if job is not None:
        r = store.result(job)  # unknown or unfinished: one line, with suggestions
        if not (r.dir / "model").is_dir() or "task" not in r.params:
            raise HeadcountError(f"job {job!r} kept no model with a task (its folder has no model/)")
        return r
    for r in results:
        if r.kind == "finetune" and (r.dir / "model").is_dir() and "task" in r.params \
                and not set(r.meta.get("inputs", {})) & {"mask", "weight_mask"}:
            return r
    return None


def from_model(model: str, task: str | None, *, scores=(), masks=(), texts=None, examples: int = DEFAULT_EXAMPLES,
               device=None) -> dict:
    """The page model of a model on a task: attention on ``examples`` dev examples (or on ``texts``),
    and the grids of the given ``scores.json`` and ``mask.json`` files. ``task`` None (with
    ``texts``): the attention on the texts alone, the model loaded with its own head, no task.

    Raises:
        HeadcountError: a file that cannot be read or does not fit the model, an empty text.
    """
    EXAMPLES_SHOWN.check(examples, "--examples")
    files = [(Path(p), "score") for p in scores] + [(Path(p), "mask") for p in masks]
    loaded = [(p, kind, read_json(p, "scores file" if kind == "score" else "mask file")) for p, kind in files]
    for p, kind, d in loaded:
        if not isinstance(d, dict) or not isinstance(d.get("heads"), list):
            raise HeadcountError(f"{p} is not a {'scores' if kind == 'score' else 'mask'} file (no 'heads' grid)")
    ex = attention_examples(model, task, examples=examples, texts=texts, device=device)
    n_layers, n_heads = ex["layout"]
    page = new_page(n_layers, n_heads, title=f"{Path(model).name or model} on {ex['task'] or 'your texts'}",
                    source={"kind": "model", "model": str(model), "task": None if task is None else str(task)})
    kv_groups(page, ex.get("kv_heads"))
    for p, kind, d in loaded:
        add_quantity(page, _file_label(p, kind, d), d["heads"], d.get("mlps"), kind=kind, key=str(p))
    add_seed_summaries(page)
    what = f"{ex['n']} of your texts" if texts is not None else f"{ex['n']} dev examples of {ex['task']}"
    page["attention"] = attention_block(f"{Path(model).name or model} on {what}", ex["tokens"], ex["maps"], ex["note"])
    if not loaded:
        page["notes"].append("No score or mask files given (--scores, --mask): the grid shows each head's "
                             "attention entropy on the examples.")
    add_quantity(page, "attention entropy (nats, mean over queries and examples)", ex["entropy"], kind="score")
    return finish(page)


def kv_groups(page: dict, n_kv: int | None) -> None:
    """A decoder with grouped-query attention: the page groups its query heads by the key/value
    head they read (``page["kv_heads"]``; the grids mark where each group starts, the detail panel
    names a head's group)."""
    if n_kv and n_kv < page["heads"]:
        page["kv_heads"] = int(n_kv)
        size = page["heads"] // n_kv
        page["notes"].append(f"Grouped-query attention: {n_kv} key/value heads per layer, each read by {size} query "
                             f"heads (query head h reads KV group h // {size}); a thick left edge starts each group.")


def _file_label(path: Path, kind: str, d: dict) -> str:
    """A ``--scores`` or ``--mask`` file's name on the page: by its method, objective and task
    when the file records them (``headcount score`` and ``headcount prune`` do), else its path."""
    if kind == "score" and (d.get("method") or d.get("objective")):
        return describe("score", str(path), "score", {}, d)
    if kind == "mask" and (d.get("method") or d.get("task")):
        method = METHODS.get(d.get("method"), f"{d.get('method')} importance" if d.get("method") else "")
        task = _short_task(d.get("task"))
        return "mask" + (f" (pruned by {method})" if method else "") + (f", {task}" if task else "")
    return f"{'kept: ' if kind == 'mask' else ''}{path}"


def _texts(task, texts, examples: int) -> tuple[list[tuple[str, ...]], int]:
    if texts is not None:
        texts = [(t,) if isinstance(t, str) else tuple(t) for t in texts]
        if not texts:
            raise HeadcountError("no texts given")
        for i, t in enumerate(texts):
            if not all(isinstance(s, str) for s in t) or not "".join(t).strip():
                raise HeadcountError(f"text {i + 1} is empty")
        if len(texts) > EXAMPLES_SHOWN.high:
            raise HeadcountError(f"{len(texts)} texts given; the explorer shows at most {int(EXAMPLES_SHOWN.high)}")
        return texts, 0
    data = task.load(task.validation_split, max_examples=examples, seed=0)
    kept = [t for t in data.texts if "".join(t).strip()]
    if not kept:
        raise HeadcountError(f"the {task.validation_split} examples of task {task.name} are empty texts")
    return kept, len(data.texts) - len(kept)


def attention_examples(model: str, task, *, examples: int = DEFAULT_EXAMPLES, texts=None, device=None,
                       layout: tuple[int, int] | None = None) -> dict:
    """Attention of ``model`` on ``examples`` dev examples of ``task`` (or on ``texts``), each cut
    to [`MAX_TOKENS`][headcount.experiments.explorer.sources.MAX_TOKENS] tokens: ``{"tokens", "maps" ([layers, heads, n, n] per example, NaN for
    a pruned head), "entropy" [layers, heads], "layout", "task", "n", "note", "kv_heads"}``
    (``kv_heads``: a decoder's key/value heads per layer, None for an encoder). ``task`` None
    (``texts`` given): the model with the head it was saved with (attention does not read the
    head), ``"task"`` None.

    Raises:
        HeadcountError: an unknown task, a model that cannot be loaded, an empty text, or a model
            whose grid is not ``layout``.
    """
    import torch

    from headcount.core.attention import attention_maps
    from headcount.core.gates import hooks, kept_heads
    from headcount.core.gates import layout as grid_of
    from headcount.data.tasks import get_task
    from headcount.core.models import load_model, load_tokenizer
    from headcount.importance.pipeline import load_for
    from headcount.runtime.device import model_device, resolve_device

    task = get_task(task) if isinstance(task, (str, Path)) else task
    if task is None and texts is None:
        raise HeadcountError("the attention needs a task's dev examples (--task) or your own texts (--text)")
    chosen, skipped = _texts(task, texts, examples)
    if task is None:  # the texts alone: no task head to build, the checkpoint as saved
        net, tokenizer = load_model(str(model)), load_tokenizer(str(model))
        net.to(resolve_device(device))
    else:
        net, tokenizer, _ = load_for(str(model), task, "task", device=device)
    net.eval()
    grid = grid_of(net)
    n_layers, n_heads = grid
    if layout is not None and tuple(layout) != (n_layers, n_heads):
        raise HeadcountError(f"the model {model} has {n_layers} x {n_heads} heads, the run's results {layout[0]} x {layout[1]}")
    blocks = hooks(net).blocks
    tokens, maps, entropy = [], [], np.zeros((n_layers, n_heads))
    dev = model_device(net)
    for t in chosen:
        enc = tokenizer(*t, truncation=True, max_length=MAX_TOKENS, return_tensors="pt")
        batch = {k: v.to(dev) for k, v in enc.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
        with torch.no_grad():
            per_layer = attention_maps(net, **batch)
        n = int(batch["input_ids"].shape[1])
        full = np.full((n_layers, n_heads, n, n), np.nan, dtype=np.float32)
        for i, m in enumerate(per_layer):
            kept = kept_heads(blocks[i].out_projection, n_heads)
            full[i, kept] = m[0].float().cpu().numpy()
        tokens.append(tokenizer.convert_ids_to_tokens(enc["input_ids"][0].tolist()))
        maps.append(full)
        with np.errstate(divide="ignore", invalid="ignore"):
            entropy += -np.nansum(np.where(full > 0, full * np.log(full), 0.0), -1).mean(-1) / len(chosen)
    entropy[np.isnan(maps[0]).any(axis=(2, 3))] = np.nan
    note = f"{skipped} empty examples left out." if skipped else None
    return {"tokens": tokens, "maps": maps, "entropy": entropy, "layout": (n_layers, n_heads),
            "task": None if task is None else task.name,
            "n": len(chosen), "note": note, "kv_heads": grid.n_kv_heads}
