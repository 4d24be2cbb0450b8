"""The demo study: a quick transfer part and a quick lottery part on the offline default.

``headcount demo`` runs ``configs/demo.yaml`` (quick profile) or ``configs/demo-full.yaml``.
Orchestration only: the jobs and report sections are those of [`transfer`][headcount.experiments.studies.transfer] and
[`lottery`][headcount.experiments.studies.lottery], under the name prefixes ``transfer/`` and ``lottery/``; jobs that the two parts
share (same kind and settings, e.g. the same fine-tuning) run once.
"""

from __future__ import annotations

from headcount.experiments.runner import Job, StudyConfig, register_study
from headcount.experiments.studies.lottery import LotterySettings, lottery_jobs, lottery_sections, lottery_summary
from headcount.experiments.studies.transfer import TransferSettings, transfer_jobs

PARTS = ("transfer", "lottery")

#: The first line of every demo report and terminal summary: a demo trains a few dozen steps on a
#: few hundred examples, far from convergence, so its numbers must not be read as results.
NOTICE = ("**These numbers illustrate the pipeline only.** A demo fine-tunes for a few dozen steps on a "
          "few hundred examples with one or two seeds, far from convergence: cite nothing from it. For "
          "results, run `configs/lottery-offline.yaml` and `configs/transfer-offline.yaml` (sized to "
          "converge) or the GLUE configs.")


#: The demo's headline figures: the first one drawn is shown at the top, beside the glance table.
HEADLINES = ("lottery_scores", "transfer-heatmaps", "transfer-scatter")

#: The glance table's caption in the demo.
GLANCE = ("This run's main numbers (mean ± std over seeds, [interval] where there is one) beside the papers': "
          "Prasanna et al.'s published dev means (BERT-base, 5 seeds; for a sentiment task the paper lacks, its "
          "nearest, SST-2, named in the cell), none for Chiang & Chen (2021), who publish no numbers that "
          "headcount records. The tables below have the rest.")


class DemoConfig(StudyConfig):
    """``study: demo``: an optional ``transfer`` part and an optional ``lottery`` part.

    ``notice`` opens the report (default [`NOTICE`][headcount.experiments.studies.demo.NOTICE]).

    >>> DemoConfig(study="demo").transfer is None
    True
    """

    transfer: TransferSettings | None = None
    lottery: LotterySettings | None = None
    notice: str = NOTICE


def expand(config: DemoConfig) -> list[Job]:
    """The jobs of both parts (``transfer/...``, ``lottery/...``)."""
    jobs: list[Job] = []
    if config.transfer is not None:
        jobs += transfer_jobs(config.transfer, prefix="transfer/")
    if config.lottery is not None:
        jobs += lottery_jobs(config.lottery, prefix="lottery/")
    return jobs


def report(store, config: DemoConfig):
    """Both parts' summaries and sections, transfer first, under the demo's notice."""
    from headcount.experiments.report import ReportContent, glance_table, headline_of
    from headcount.experiments.studies.lottery.report import lottery_glance
    from headcount.experiments.studies.transfer.report import transfer_glance
    from headcount.experiments.studies.transfer.summary import transfer_caveats
    from headcount.experiments.studies.transfer.report import transfer_sections
    from headcount.experiments.studies.transfer.summary import transfer_summary
    from headcount.experiments.studies.transfer.tables import transfer_tables

    summary, parts, glance, caveats = [], [], [], []
    if config.transfer is not None:
        tables = transfer_tables(store, config.transfer, prefix="transfer/")
        summary.append(transfer_summary(tables, config.transfer))
        parts.append(transfer_sections(store, config.transfer, prefix="transfer/", tables=tables))
        glance += [{**r, "quantity": f"transfer: {r['quantity']}"} for r in transfer_glance(tables, config.transfer)]
        caveats += transfer_caveats(tables)
    if config.lottery is not None:
        summary.append(lottery_summary(store, config.lottery, prefix="lottery/"))
        parts.append(lottery_sections(store, config.lottery, prefix="lottery/"))
        glance += [{**r, "quantity": f"lottery: {r['quantity']}"}
                   for r in lottery_glance(store, config.lottery, prefix="lottery/")]
    # Each part opens with its main tables: put every part's first section on top, then the rest,
    # so that a reader sees both studies' main numbers before any figure.
    sections = [part[0] for part in parts if part] + [s for part in parts for s in part[1:]]
    return ReportContent(summary="\n\n".join(s for s in summary if s), sections=sections, notice=config.notice,
                         glance=glance_table(glance, "glance", GLANCE), caveats=caveats,
                         headline=headline_of(sections, HEADLINES))


register_study("demo", DemoConfig, expand, report,
               description="the quick offline demo: a transfer part and a lottery part")
