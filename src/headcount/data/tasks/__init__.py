"""Tasks and data: the GLUE tasks, local task YAML files, the offline tasks, the masked-LM objective.

The contract (docs/DATA-API.md)::

    get_task(name_or_yaml_path) -> Task          list_tasks() -> list[str]
    resolve_task_ref(value, base_dir) -> str     (a registered name wins over a relative path)
    Task.load(split, max_examples=None, seed=0) -> TaskData
    encode(data, tokenizer, max_length=128, cache_dir=None) -> Encoded
    make_batches(encoded, batch_size, *, shuffle=False, seed=0, group_by_length=True, pad_token_id=0)
    compute_metrics(metric, predictions, labels) -> dict  (always has "score")
    mlm_texts(source, max_examples=None, seed=0) -> list[str]
    mlm_batches(texts, tokenizer, *, max_length=128, batch_size=32, seed=0, probability=0.15)

(The masked-LM head fitted on a frozen encoder is [`headcount.data.mlm_head.fit_mlm_head`][headcount.data.mlm_head.fit_mlm_head].)
"""

from headcount.data.tasks.base import METRICS, NO_LABEL, FilesSource, Source, Task, TaskData
from headcount.data.tasks.batching import Encoded, encode, make_batches, tokenize
from headcount.data.tasks.glue import GLUE, glue_task
from headcount.data.tasks.local import load_task_yaml
from headcount.data.tasks.metrics import compute_metrics
from headcount.data.tasks.mlm import lm_batches, mask_tokens, mlm_batches, mlm_texts
from headcount.data.tasks.offline import OFFLINE_TASKS, is_fetched, offline_corpus, offline_task
from headcount.data.tasks.offline_fetch import fetch
from headcount.runtime.paths import cache_root, data_root
from headcount.data.tasks.registry import get_task, list_tasks, register_task, resolve_task_ref

__all__ = [
    "METRICS", "NO_LABEL", "GLUE", "OFFLINE_TASKS",
    "Task", "TaskData", "Source", "FilesSource", "Encoded",
    "get_task", "list_tasks", "register_task", "resolve_task_ref", "glue_task", "offline_task", "load_task_yaml",
    "encode", "tokenize", "make_batches", "compute_metrics",
    "mlm_texts", "mlm_batches", "mask_tokens", "lm_batches",
    "fetch", "is_fetched", "offline_corpus", "data_root", "cache_root",
]

