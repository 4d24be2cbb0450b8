"""Glue shared by the commands and the studies: a model, batches and a metric for an objective.

``objective="task"``: the task's own loss and metric (classification or regression head).
``objective="mlm"``: masked LM on the task's texts (or any MLM corpus); a checkpoint without an
MLM head gets one fitted on the frozen encoder, and the returned info says so.
``objective="embedding"`` / ``"embedding-supervised"``: the contrastive loss of
``headcount.data.embedding`` on the encoder's pooled states (no head; the texts, or the pairs).
``objective="lm"``: a decoder's causal-LM (next-token) loss on the task's texts, its own head.
A needle-in-a-haystack task ([`headcount.data.tasks.niah`][headcount.data.tasks.niah]) with ``task`` or ``lm``: the
causal-LM loss of the needle's answer (the prompt's labels are -100), the decoder's own head.

The settings these verbs take are declared in [`headcount.importance.settings`][headcount.importance.settings] (re-exported here).
"""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np
import transformers

from headcount.core.arch import require_decoder
from headcount.core.model_spec import model_source, resolve
from headcount.core.models import load_model, load_tokenizer, new_weights, pad_for_classification
from headcount.data.embedding import (
    EVAL_METRIC,
    PAIR_METRIC,
    SIMILARITY_METRIC,
    Contrastive,
    check_pairs,
    embed,
    embedding_batches,
    is_embedding,
    pooling_of,
    similarity_agreement,
)
from headcount.data.embedding import contrastive as contrastive_loss
from headcount.data.evaluation import LM_METRIC, MLM_METRIC, evaluate_batches, masked_positions_only
from headcount.data.mlm_head import MLM_HEAD_MAX_TEXTS, fit_mlm_head
from headcount.data.tasks import encode, lm_batches, make_batches, mlm_batches, tokenize
from headcount.data.tasks.base import subset_indices
from headcount.data.tasks.batching import batch_order
from headcount.data.tasks.niah import is_niah, niah_batches
from headcount.importance.pruning import PruneConfig, iterative_prune
from headcount.importance.scoring import score
from headcount.importance.settings import (
    OBJECTIVES,
    DataConfig,
    PruneSettings,
    ScoreSettings,
    check_objective,
    default_of,
    settings_from,
)
from headcount.runtime.bounds import MAX_LENGTH_RANGE
from headcount.runtime.device import Runtime, resolve_device, runtime
from headcount.runtime.errors import HeadcountError

__all__ = ["MAX_LENGTH_RANGE", "OBJECTIVES", "DataConfig", "PruneSettings", "ScoreSettings",
           "batches_for", "check_objective", "decoding", "default_of", "example_order", "has_task_head", "load_for",
           "metric_for", "prune_model", "saved_config", "settings_from", "task_head"]


def saved_config(model_spec: str):
    """The checkpoint's transformers config, or None when it cannot be read (loading reports why)."""
    try:
        return transformers.AutoConfig.from_pretrained(resolve(model_spec))
    except (OSError, ValueError):
        return None  # load_model reports the real problem


def has_task_head(model_spec: str) -> bool:
    """Whether the checkpoint was saved with a sequence-classification head."""
    cfg = saved_config(model_spec)
    return cfg is not None and any(a.endswith("ForSequenceClassification") for a in (cfg.architectures or []))


def task_head(model_spec: str, task) -> dict:
    """Whether the checkpoint's classification head fits ``task`` (a new head always does).

    Returns ``{"head": "new" | "checkpoint", "head_note": ...}``.

    Raises:
        HeadcountError: a fine-tuned head with another number of outputs (or kind) than the task.
    """
    if not has_task_head(model_spec):
        return {"head": "new", "head_note": f"new {task.num_labels}-output {task.kind} head on the pre-trained model"}
    cfg = saved_config(model_spec)
    n = int(cfg.num_labels)
    regression = getattr(cfg, "problem_type", None) == "regression"
    if n != task.num_labels or (task.kind == "regression") != (regression or n == 1):
        raise HeadcountError(
            f"{model_spec} is a fine-tuned {'regression model' if n == 1 else f'classifier with {n} labels'}; "
            f"task {task.name} needs {task.num_labels} "
            f"{'output' if task.kind == 'regression' else 'labels'} (start from the pre-trained model instead)"
        )
    return {"head": "checkpoint", "head_note": f"the checkpoint's {n}-output head is fine-tuned further"}


def load_for(model_spec: str, task, objective: str = "task", mlm_texts=None, seed: int = 0, device=None):
    """The model for ``objective`` on ``task``, on its device: ``(model, tokenizer, info)``.

    ``model_spec``: a spec or a [`ModelSource`][headcount.core.model_spec.ModelSource]; resolved here once.
    ``device``: ``auto`` | ``cpu`` | ``cuda`` | ``cuda:N``; None = ``$HEADCOUNT_DEVICE`` (set by the
    study runner for each job), else ``auto`` (the GPU when there is one); or a resolved
    ``Runtime``. The model is moved there once; the verbs it is then
    given (score, evaluate, prune) keep it there. ``info["device"]`` names it.

    ``info["head"]`` says where the output head came from: ``"checkpoint"``, ``"new"`` (a task
    head that was not in the checkpoint: untrained, its weights drawn with ``seed``, which
    ``info["head_seed"]`` records), ``"fitted"`` (an MLM head fitted on the
    frozen encoder) or ``"pooling"`` (the embedding objectives: the encoder alone;
    ``info["contrastive"]`` is the ``Contrastive`` to score with, its
    pooling read from the checkpoint's sentence-transformers config, its views seeded by ``seed``).
    """
    check_objective(objective)
    niah = _niah_objective(task, objective)  # a needle-in-a-haystack task: its answer's loss (refused before loading)
    if objective == "embedding-supervised":
        check_pairs(task)  # refused before anything loads
    # an unavailable device is refused before anything loads
    where = device.device if isinstance(device, Runtime) else resolve_device(device)
    model_spec = model_source(model_spec)  # resolved once: the loaders below take it as it is
    tokenizer = load_tokenizer(model_spec)
    if is_embedding(objective):
        spec = Contrastive(supervised=objective == "embedding-supervised", pooling=pooling_of(model_spec.path),
                           seed=seed)
        model = load_model(model_spec, head="base").to(where)
        return model, tokenizer, {"head": "pooling", "pooling": spec.pooling, "contrastive": spec,
                                  "device": str(where)}
    if objective == "lm" or niah:  # a decoder's own language-model head
        model = load_model(model_spec, head="lm")
        require_decoder(model, "--objective lm", model_spec)  # BERT loads as a causal LM, but was not trained as one
        model.to(where)
        return model, tokenizer, {"head": "checkpoint", "device": str(where)}
    if objective == "task":
        head = task_head(model_spec, task)["head"]  # refuses a fine-tuned head that does not fit
        # a head the checkpoint lacks starts from weights drawn with ``seed``: the same run, the same head
        model = pad_for_classification(load_model(model_spec, head=task.kind, num_labels=task.num_labels, seed=seed),
                                       tokenizer)
        if new_weights(model):  # the config names a task head, its weights are not all there
            head = "new"
        seeded = {"head_seed": int(seed)} if head == "new" else {}
        return model.to(where), tokenizer, {"head": head, **seeded, "device": str(where)}
    texts = mlm_texts if mlm_texts is not None else _texts(task, task.train_split, MLM_HEAD_MAX_TEXTS, seed)
    model, report = fit_mlm_head(model_spec, texts, device=where)
    model.to(where)
    return model, tokenizer, {"head": "fitted" if report.get("fitted") else "checkpoint", "mlm_head": report,
                              "device": str(where)}


def _texts(task, split, max_examples, seed) -> list[str]:
    data = task.load(split, max_examples=max_examples, seed=seed)
    return [" ".join(t) for t in data.texts]


def batches_for(task, tokenizer, objective: str, data: DataConfig, split: str | None = None,
                group_by_length: bool = True) -> list[dict]:
    """Batches (dynamic padding) for ``objective`` on a split of ``task``.

    ``group_by_length``: grouped by length, longest first (less padding); False: the split's
    order in fixed-size batches, each padded to its own longest example (the references'
    ``SequentialSampler``: what ``cumulative`` importance needs, see ``ScoreSettings.batch_order``).
    """
    split = split or data.split or task.train_split
    task.check_split(split)  # the task's one line: which splits it has, how to declare the missing one
    if is_embedding(objective):
        return embedding_batches(task, tokenizer, data, split, supervised=objective == "embedding-supervised",
                                 group_by_length=group_by_length)
    if _niah_objective(task, objective):  # prompts with the answer; labels: the answer's tokens only
        return niah_batches(task, tokenizer, split=split, max_examples=data.max_examples, seed=data.seed,
                            batch_size=data.batch_size, group_by_length=group_by_length)
    if objective == "lm":
        return lm_batches(_texts(task, split, data.max_examples, data.seed), tokenizer, max_length=data.max_length,
                          batch_size=data.batch_size, group_by_length=group_by_length)
    if objective == "mlm":
        texts = _texts(task, split, data.max_examples, data.seed)
        return mlm_batches(texts, tokenizer, max_length=data.max_length, batch_size=data.batch_size, seed=data.seed,
                           group_by_length=group_by_length)
    loaded = task.load(split, max_examples=data.max_examples, seed=data.seed)
    encoded = encode(loaded, tokenizer, max_length=data.max_length)
    return make_batches(encoded, data.batch_size, shuffle=False, group_by_length=group_by_length,
                        pad_token_id=tokenizer.pad_token_id or 0)


def example_order(task, tokenizer, objective: str, data: DataConfig, split: str | None = None,
                  group_by_length: bool = True):
    """Which examples [`batches_for`][headcount.importance.pipeline.batches_for]'s batches hold, in the order of their rows.

    Per-example scores come out in this order. ``(source, index)``: ``source`` is
    ``"<task name>/<split>"``, ``index`` ``[n_examples]`` int64 positions in that split, so one text
    has the same id whatever the objective or the tokenizer (MLM and task importance of a task's
    examples pair up by id; different texts never do). Recomputed with the rule of
    [`batches_for`][headcount.importance.pipeline.batches_for] (the seeded subset, then the batches' length grouping; tokens come from
    the cache).
    """
    split = split or data.split or task.train_split
    loaded = task.load(split, max_examples=data.max_examples, seed=data.seed)
    picked = (subset_indices(len(task.load(split)), data.max_examples, data.seed)
              if data.max_examples is not None else None)
    picked = np.arange(len(loaded)) if picked is None else np.asarray(picked, dtype=np.int64)
    if objective in ("mlm", "embedding", "lm"):  # the texts joined (embedding-supervised: the task's pairs)
        lengths = tokenize([(" ".join(t),) for t in loaded.texts], tokenizer, max_length=data.max_length).lengths
    else:
        lengths = encode(loaded, tokenizer, max_length=data.max_length).lengths
    order = batch_order(np.asarray(lengths), data.batch_size, group_by_length=group_by_length)
    rows = np.concatenate(order) if order else np.zeros(0, dtype=np.int64)
    return f"{task.name}/{split}", picked[rows].astype(np.int64)


def _niah_objective(task, objective: str) -> bool:
    """Whether ``task`` is a needle-in-a-haystack task, whose objective (``task`` or ``lm``) is the
    causal-LM loss of the answer; other objectives are refused."""
    if not is_niah(task):
        return False
    if objective not in ("task", "lm"):
        raise HeadcountError(f"task {task.name} is a needle-in-a-haystack task: its objective is the answer's "
                             f"causal-LM loss (--objective lm, or task), not {objective}")
    return True


def metric_for(task, objective: str) -> str:
    """The stop rule's metric: the task's, masked-token accuracy, a decoder's next-token accuracy
    (``lm``), the embedding's agreement with the unpruned model's similarities (no labels) or the
    pairs' cosine Pearson/Spearman (STS-B's)."""
    if _niah_objective(task, objective):  # next-token accuracy on the answer's tokens
        return LM_METRIC
    return {"mlm": MLM_METRIC, "lm": LM_METRIC, "embedding": SIMILARITY_METRIC,
            "embedding-supervised": PAIR_METRIC}.get(objective, task.metric)


def prune_model(model, importance_batches, stop_batches, metric: str, *, settings: PruneSettings | None = None,
                config: PruneConfig | None = None, progress=None, device=None, precision=None,
                tokens_per_batch: int | None = None, contrastive: Contrastive | None = None):
    """Iterative pruning of ``model``: importance on one set of batches, the stop rule on another.

    ``settings``: the method, normalisation and accumulation of importance ([`PruneSettings`][headcount.importance.settings.PruneSettings];
    its splits are the caller's business: they chose the batches). ``config``: the loop.
    ``device`` / ``precision`` / ``tokens_per_batch``: see ``headcount.runtime.device`` (None: where
    the model is, or ``$HEADCOUNT_DEVICE``; ``device`` may be a resolved
    ``Runtime``). The working copy is made on that device. Importance
    is taken at the mask's gate values (``at_mask``), as the references' gate tensors are.
    ``contrastive``: the embedding objectives (``info["contrastive"]`` of [`load_for`][headcount.importance.pipeline.load_for]):
    importance uses its loss, on the batches as given; the stop rule (``metric``:
    [`metric_for`][headcount.importance.pipeline.metric_for]'s) is, unsupervised, the Spearman agreement of the pruned model's pairwise
    similarities of the stop texts with the unpruned model's
    ([`similarity_agreement`][headcount.data.embedding.similarity_agreement]), supervised, the pairs' cosine
    Pearson/Spearman with their labels.

    Returns the [`PruneResult`][headcount.importance.pruning.PruneResult] of [`iterative_prune`][headcount.importance.pruning.iterative_prune],
    its ``meta`` (and mask meta) naming the device and precision.
    """
    settings = settings or PruneSettings()
    method, normalize, accumulate = settings.method, settings.normalize, settings.accumulate
    rt = runtime(model, device, precision, tokens_per_batch)  # the verbs below are handed it as it is

    def score_fn(m, mask):
        with decoding(m, metric):
            return score(m, importance_batches, method=settings.scorer, normalize=normalize, mask=mask,
                         at_mask=True, accumulate=accumulate, contrastive=contrastive, device=rt)

    reference = None
    if contrastive is not None and metric == SIMILARITY_METRIC:  # the unpruned model's embeddings
        reference = embed(model, stop_batches, contrastive.pooling, device=rt)

    def eval_fn(m, mask):
        if reference is not None:
            r = similarity_agreement(embed(m, stop_batches, contrastive.pooling, mask, device=rt), reference)
        elif contrastive is not None:  # the pairs' correlation, batches as given
            with contrastive_loss(m, contrastive):
                r = evaluate_batches(m, stop_batches, EVAL_METRIC[metric], mask=mask, device=rt, tokens_per_batch=0)
        else:
            r = evaluate_batches(m, stop_batches, metric, mask=mask, device=rt)
        return r["score"], r["loss"]

    result = iterative_prune(model, score_fn, eval_fn, config or PruneConfig(), progress=progress)
    accumulated = {"accumulate": accumulate} if settings.scorer.accumulations else {}
    result.meta.update({**rt.meta(), "method": method, **accumulated})
    result.mask = result.mask.with_meta(device=str(rt.device), precision=rt.precision, method=method, **accumulated)
    return result


def decoding(model, metric: str):
    """For the masked-LM objective, decode only masked positions (same loss and gradients,
    much less work); otherwise a no-op context."""
    return masked_positions_only(model) if metric == MLM_METRIC else nullcontext(model)
