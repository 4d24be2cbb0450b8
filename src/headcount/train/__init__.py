"""Fine-tuning and retraining with masks, on the transformers ``Trainer`` (package ``headcount.train``).

Built on ``Trainer`` so that what users expect keeps working: ``accelerate launch`` / torchrun on
several GPUs, bf16 mixed precision, checkpoints, experiment trackers (``report_to``). headcount adds:

- dynamic padding (pad to the longest example of the batch) and length-grouped batches, with a
  sampler seeded per epoch so that a resumed run sees exactly the batches an uninterrupted run sees;
- masks: a head/MLP [`Mask`][headcount.core.masks.Mask] applied to the *pre-trained* weights before
  training, physically (``mask_mode="prune"``, via [`shrink`][headcount.core.surgery.shrink]) or as gates
  fixed at 0 (``mask_mode="gate"``); a magnitude weight mask (see ``headcount.importance.magnitude``)
  applied with ``torch.nn.utils.prune`` hooks that stay on during training;
- one output folder per run: ``model/`` (the checkpoint), ``metrics.json`` (per-epoch validation
  metric, final metrics, time, tokens/s, parameters, mask summary), ``run.json`` (what the run is)
  and, while it runs, ``checkpoints/`` (Trainer checkpoints). Calling [`finetune`][headcount.train.finetuning.finetune] again with
  the same ``out_dir`` resumes from the newest *complete* checkpoint (one cut short by a kill
  or a full disk, without a readable ``trainer_state.json``, is discarded), or returns the
  finished run's metrics. The run's identity (``run.json``) holds content fingerprints of the
  model and the task's data files ([`headcount.data.fingerprint`][headcount.data.fingerprint]): edited data is another run.

Prasanna et al. (2020) hyper-parameters are the defaults: lr 2e-5, batch 32, 3 epochs, max length
128, no weight decay, no warmup, gradient clipping at 1.0.

Modules: [`config`][headcount.train.config] (``TrainConfig``), [`data`][headcount.train.data] (datasets, padding, samplers),
[`trainer`][headcount.train.trainer] (the Trainer subclass, callbacks, checkpoints), [`finetuning`][headcount.train.finetuning] (the
[`finetune`][headcount.train.finetuning.finetune] verb), [`evaluating`][headcount.train.evaluating] ([`evaluate`][headcount.train.evaluating.evaluate]), [`magnitude_search`][headcount.train.magnitude_search] (the
magnitude-pruning procedures, which retrain).

May import: ``headcount.importance``, ``headcount.data``, ``headcount.core``,
``headcount.runtime`` (not ``headcount.analysis``, its sibling layer).
"""

from headcount.train.config import MASK_MODES, TrainConfig, use_bf16
from headcount.train.data import DynamicPadding, EncodedDataset, LengthGroupedEpochSampler
from headcount.train.evaluating import evaluate
from headcount.train.finetuning import finetune, mask_summary, prepare_model
from headcount.train.trainer import CLOCK_FILE, last_complete_checkpoint

__all__ = ["MASK_MODES", "TrainConfig", "use_bf16", "DynamicPadding", "EncodedDataset", "LengthGroupedEpochSampler",
           "evaluate", "finetune", "mask_summary", "prepare_model", "CLOCK_FILE", "last_complete_checkpoint"]
