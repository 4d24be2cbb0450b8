"""The reports' claim sentences are computed from the numbers: every estimate with its interval,
"interval contains chance" wherever an interval contains the chance level, orderings backed by a paired test
over seeds ("not significant" when it says so), and the MLM head's caveat on the MLM side.

Small tables built by hand: no training, no model.
"""

from __future__ import annotations

import math
import re
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

import headcount.experiments.studies.transfer as T
from headcount.analysis import at_chance, paired_sign_flip_test, seed_interval
from headcount.experiments.studies.lottery.report import ordering_phrase, score_phrase, summary_text
from headcount.experiments.studies.lottery.tables import chance_level, chance_levels
from headcount.experiments.studies.transfer.summary import (
    MARK,
    coherence_sentence,
    deduction_sentence,
    mlm_caveat,
    prunability_sentence,
    transfer_caveats,
    transfer_summary,
)
from headcount.experiments.studies.transfer.tables import prunability_table

SEEDS = (1337, 42, 86, 71, 166)


# -- the paired test ---------------------------------------------------------------------------------
@pytest.mark.parametrize("alternative", ["two-sided", "greater", "less"])
def test_sign_flip_test_is_scipys_exact_paired_permutation_test(alternative):
    rng = np.random.default_rng(3)
    for n in (3, 5, 8):
        a, b = rng.normal(0.8, 0.05, n), rng.normal(0.78, 0.05, n)
        ours = paired_sign_flip_test(a, b, alternative)
        ref = sps.permutation_test((a - b,), np.mean, permutation_type="samples", alternative=alternative,
                                   n_resamples=np.inf)
        assert ours.exact and ours.n == n and ours.p_value == pytest.approx(ref.pvalue)
        assert ours.n_above == int((a > b).sum()) and ours.mean_diff == pytest.approx(float(np.mean(a - b)))


def test_five_seeds_reach_005_only_one_sided_and_only_when_every_seed_agrees():
    good, bad = [0.80, 0.82, 0.79, 0.85, 0.81], [0.70, 0.75, 0.72, 0.74, 0.70]
    two = paired_sign_flip_test(good, bad)
    one = paired_sign_flip_test(good, bad, "greater")
    assert two.p_value == two.min_p == 2 / 32 and not two.significant() and not two.can_reach()
    assert one.p_value == one.min_p == 1 / 32 and one.significant() and one.can_reach()
    mixed = paired_sign_flip_test([0.80, 0.82, 0.69, 0.85, 0.81], bad, "greater")  # one seed the other way
    assert mixed.n_above == 4 and mixed.p_value >= 0.05
    # a NaN seed is left out with its pair: 4 seeds, whose one-sided floor 1/16 is above 0.05
    four = paired_sign_flip_test([*good[:4], math.nan], bad, "greater")
    assert four.n == 4 and four.min_p == 1 / 16 and not four.can_reach()


def test_seed_interval_is_the_t_interval_and_at_chance_checks_containment():
    v = [0.80, 0.83, 0.78, 0.86]
    iv = seed_interval(v)
    half = sps.t.ppf(0.975, 3) * np.std(v, ddof=1) / 2
    assert iv["low"] == pytest.approx(np.mean(v) - half) and iv["high"] == pytest.approx(np.mean(v) + half)
    assert at_chance(iv["low"], iv["high"], 0.80) and not at_chance(iv["low"], iv["high"], 0.5)
    assert at_chance(0.576, 0.576, 0.5760000000001)  # equal up to rounding: at chance
    assert at_chance(0.1, 0.2, None) is None and math.isnan(seed_interval([0.8])["low"])


# -- lottery ------------------------------------------------------------------------------------------
def test_an_ordering_is_not_significant_when_the_paired_test_says_so():
    good, random = [0.80, 0.79, 0.81, 0.78, 0.80], [0.81, 0.78, 0.80, 0.80, 0.77]
    p = paired_sign_flip_test(good, random, "greater").p_value
    assert p >= 0.05
    text = ordering_phrase(good, random, "good", "random")
    assert f"not significant (p = {p:.3g}, one-sided" in text and "significant at" not in text
    assert "good higher on 3 of 5 seeds" in text
    # four seeds, all one way: p = 1/16, and the text says the design cannot reach 0.05
    text = ordering_phrase(good[:4], [x - 0.1 for x in good[:4]], "good", "random")
    assert "not significant (p = 0.0625, one-sided" in text and "cannot show significance at 0.05" in text


def test_a_significant_ordering_is_stated_with_its_p_and_says_one_sided():
    text = ordering_phrase([0.84, 0.85, 0.83, 0.84, 0.86], [0.60, 0.65, 0.55, 0.62, 0.61], "good", "random")
    assert "p = 0.0312 (one-sided), significant at 0.05" in text and "not significant" not in text
    assert "difference +0.238 ± 0.030" in text and "good higher on 5 of 5 seeds" in text


def _scores(table: dict) -> pd.DataFrame:
    """``{task: {experiment: per-seed scores}}`` -> rows as :func:`seed_scores` gives them."""
    return pd.DataFrame([{"experiment": e, "task": t, "seed": s, "metric": "accuracy", "score": v}
                         for t, exps in table.items() for e, vals in exps.items() for s, v in zip(SEEDS, vals)])


TABLE = {
    "amazon": {
        "full": [0.87, 0.86, 0.88, 0.87, 0.86],
        "good retrained": [0.80, 0.79, 0.81, 0.78, 0.80],
        "random retrained": [0.81, 0.78, 0.80, 0.80, 0.77],
        "bad retrained": [0.60, 0.80, 0.75, 0.58, 0.79],  # wide: its interval contains the majority rate
        "magnitude good retrained": [0.84, 0.85, 0.83, 0.84, 0.86],
        "magnitude random retrained": [0.60, 0.65, 0.55, 0.62, 0.61],  # interval contains 0.576
        "magnitude bad retrained": [0.576] * 5,  # the majority class on every seed
    },
    "tweets": {
        "full": [0.95, 0.94, 0.95, 0.96, 0.95],
        "good retrained": [0.93, 0.92, 0.94, 0.93, 0.92],
        "random retrained": [0.90, 0.91, 0.89, 0.90, 0.91],
        "bad retrained": [0.88, 0.89, 0.87, 0.90, 0.88],
        "magnitude good retrained": [0.94, 0.93, 0.94, 0.95, 0.93],
        "magnitude random retrained": [0.52, 0.53, 0.51, 0.55, 0.50],  # exactly around chance
        "magnitude bad retrained": [0.52] * 5,
    },
}
CHANCE = {"amazon": (0.576, "majority-class rate"), "tweets": (0.52, "majority-class rate")}


def test_the_lottery_summary_says_at_chance_for_every_task_and_experiment_whose_interval_contains_it():
    text = summary_text(_scores(TABLE), CHANCE)
    paragraphs = {p.split(" (")[0]: p for p in text.split("\n\n")[1:]}
    assert set(paragraphs) == {"amazon", "tweets"}
    expected = 0
    for task, exps in TABLE.items():
        para = paragraphs[task]
        assert f"chance {CHANCE[task][0]:.3f} = majority-class rate" in para
        for exp, vals in exps.items():
            iv = seed_interval(vals)
            shown = f"{exp} {iv['mean']:.3f} ± {iv['std']:.3f} [{iv['low']:.3f}, {iv['high']:.3f}] (n=5)"
            assert shown in para, (task, exp)  # the estimate with its interval beside it
            hit = iv["low"] <= CHANCE[task][0] <= iv["high"]
            expected += hit
            assert (f"{shown}: interval contains chance" in para) == hit, (task, exp)
    assert expected == 5 and text.count("interval contains chance") == expected + 1  # +1: the method sentence defines it


def test_the_lottery_summary_tests_the_papers_order_over_seeds():
    text = summary_text(_scores(TABLE), CHANCE)
    amazon = text.split("\n\n")[1]
    structured = amazon.split("Structured, ")[1].split("Magnitude, ")[0]
    magnitude = amazon.split("Magnitude, ")[1]
    p = paired_sign_flip_test(TABLE["amazon"]["good retrained"], TABLE["amazon"]["random retrained"], "greater")
    assert f"good > random: difference {p.mean_diff:+.3f}" in structured
    assert f"not significant (p = {p.p_value:.3g}, one-sided)" in structured
    assert "good > random: difference +0.238 ± 0.030, good higher on 5 of 5 seeds, p = 0.0312 (one-sided)" in magnitude
    assert "paired sign-flip permutation test" in text.split("\n\n")[0] and "one-sided" in text.split("\n\n")[0]
    # no ordering sentence is fixed wording: swap good and bad and the verdicts follow
    swapped = {t: {**e, "magnitude good retrained": e["magnitude bad retrained"],
                   "magnitude bad retrained": e["magnitude good retrained"]} for t, e in TABLE.items()}
    magnitude = summary_text(_scores(swapped), CHANCE).split("\n\n")[1].split("Magnitude, ")[1]
    assert "good > bad: difference -0.268" in magnitude and "good higher on 0 of 5 seeds, not significant" in magnitude


def test_intervals_of_bounded_metrics_stay_inside_their_range():
    """The demo's 'random retrained 0.841 [0.563, 1.119]' (n = 2): accuracy cannot pass 1."""
    rng = np.random.default_rng(2)
    for metric, (lo, hi) in (("accuracy", (0, 1)), ("f1", (0, 1)), ("mcc", (-1, 1)), ("pearson_spearman", (-1, 1))):
        for n in (2, 3, 5):
            v = np.clip(rng.normal(0.85 if lo == 0 else 0.0, 0.2 if lo == 0 else 0.8, n), lo, hi)
            text = score_phrase(v, metric=metric)
            low, high = (float(x) for x in re.search(r"\[(-?[\d.]+), (-?[\d.]+)\]", text).groups())
            raw = seed_interval(v)
            assert lo <= low <= high <= hi
            assert ("clipped" in text) == (raw["low"] < lo or raw["high"] > hi)
    demo = score_phrase([0.719, 0.963], metric="accuracy")  # mean 0.841, t interval [-0.71, 2.39] unclipped
    assert demo.startswith("0.841 ± 0.173 [0.000, 1.000] (n=2, interval clipped")
    assert "clipped" not in score_phrase([0.719, 0.963])  # an unknown metric: no range, no clipping


def test_score_phrase_without_an_interval_makes_no_chance_claim():
    assert score_phrase([0.576], chance=0.576) == "0.576 (n=1, no interval)"
    assert score_phrase([0.576, 0.576], chance=None) == "0.576 ± 0.000 [0.576, 0.576] (n=2)"


def test_chance_levels_come_from_the_dev_labels(tmp_path):
    (tmp_path / "dev.csv").write_text("sentence,label\na,negative\nb,negative\nc,negative\nd,positive\n")
    (tmp_path / "train.csv").write_text("sentence,label\na,negative\nb,positive\n")
    (tmp_path / "task.yaml").write_text(
        "name: tiny\nkind: classification\nfiles: {train: train.csv, validation: dev.csv}\n"
        "text: [sentence]\nlabel: label\nlabels: [negative, positive]\nmetric: accuracy\n")
    settings = SimpleNamespace(tasks=[str(tmp_path / "task.yaml")],
                               train=SimpleNamespace(max_eval_examples=None, data_seed=0))
    assert chance_levels(settings) == {"tiny": (0.75, "majority-class rate")}
    assert chance_level("f1", [0, 0, 0, 1])[0] == pytest.approx(2 * 0.25 / 1.25)  # always "positive"
    assert chance_level("mcc") == chance_level("pearson") == (0.0, "no correlation")
    assert math.isnan(chance_level("accuracy")[0])


# -- transfer -----------------------------------------------------------------------------------------
def _row(comparison, task, statistic, estimate, low, high, p=None, chance=0.0, task_b=None):
    return {"comparison": comparison, "view": "application", "task": task, "task_b": task_b,
            "statistic": statistic, "estimate": estimate, "low": low, "high": high, "p_value_max": p,
            "chance": chance, "n": 3, "n_finite": 3, "ci": "hierarchical bootstrap (t)"}


J = 0.25 / 1.75  # the top-25% Jaccard chance level
SUMMARY = pd.DataFrame([
    _row("mlm-vs-task", "amazon", "spearman", 0.19, 0.09, 0.28, p=0.014),
    _row("mlm-vs-task", "tweets", "spearman", 0.12, -0.05, 0.29, p=0.18),  # at chance, not significant
    _row("mlm-vs-task", "amazon", "jaccard@0.25", 0.16, 0.07, 0.25, chance=J),
    _row("mlm-vs-task", "tweets", "jaccard@0.25", 0.23, 0.12, 0.33, chance=J),
    _row("task-vs-task", "amazon", "spearman", 0.86, 0.79, 0.93, p=0.0001, task_b="tweets"),
    _row("mlm-vs-task-before", "amazon", "spearman", 0.52, 0.48, 0.57, p=0.0001),
])
MLM = pd.DataFrame({"corpus": ["amazon"], "texts": ["offline/amazon"], "head": ["fitted"],
                    "head_heldout_loss": [6.1], "head_heldout_accuracy": [0.093], "validation_loss": [6.4],
                    "validation_accuracy": [0.11], "validation_masked_tokens": [1500]})


def _tables(**over):
    tables = {"coherence_summary": SUMMARY, "coherence": pd.DataFrame(), "mlm": MLM, "prunability": pd.DataFrame(),
              "acceptable_deduction_summary": pd.DataFrame()}
    return {**tables, **over}


def test_coherence_says_at_chance_for_every_task_and_not_significant_where_p_is_large():
    settings = T.TransferSettings(tasks=["offline/movies"], seeds=[1, 2, 3])
    text = coherence_sentence(_tables(), "mlm-vs-task", "MLM vs task (fine-tuned)", settings)
    assert "amazon 0.19 [0.09, 0.28] (n=3), p <= 0.014 on each of 3 seeds" in text  # significant: with its p
    assert ("tweets 0.12 [-0.05, 0.29] (n=3): interval contains chance (0.00), "
            "not significant (largest p over 3 seeds = 0.18)") in text
    jaccard = text.split("Top-25% Jaccard")[1]
    assert "amazon 0.16 [0.07, 0.25] (n=3): interval contains chance" in jaccard and "tweets 0.23 [0.12, 0.33] (n=3): interval contains chance" in jaccard
    assert text.count("interval contains chance") == 3  # every task and statistic whose interval contains chance, no other
    assert "two-sided permutation test, heads permuted within layers" in text and "[95% interval" in text


def test_a_summary_row_without_an_interval_gets_the_t_interval_over_seeds():
    settings = T.TransferSettings(tasks=["offline/movies"], seeds=[1, 2, 3])
    summ = pd.DataFrame([_row("seed-vs-seed", "amazon", "spearman", 0.5, math.nan, math.nan, p=0.2)])
    per_seed = pd.DataFrame({"comparison": "seed-vs-seed", "view": "application", "task": "amazon", "task_b": None,
                             "statistic": "spearman", "estimate": [0.1, 0.5, 0.9]})
    iv = seed_interval([0.1, 0.5, 0.9])
    text = coherence_sentence(_tables(coherence_summary=summ, coherence=per_seed), "seed-vs-seed", "Seed vs seed",
                              settings)
    assert f"amazon 0.50 [{iv['low']:.2f}, {iv['high']:.2f}] (n=3): interval contains chance" in text
    assert "t interval over seeds" in text and "not significant (largest p over 3 seeds = 0.2)" in text


def test_every_mlm_side_sentence_carries_the_fitted_heads_accuracy():
    settings = T.TransferSettings(tasks=["offline/movies"], seeds=[1, 2, 3])
    caveat = mlm_caveat(_tables())
    assert "fitted on the frozen encoder" in caveat and "held-out masked-token accuracy 0.09 (amazon)" in caveat
    rows = []
    for seed in (1, 2, 3):
        for order in ("task", "mlm", "random"):
            rows += [{"task": "amazon", "objective": "task", "view": "application", "order": order, "seed": seed,
                      "fraction": f, "score": s} for f, s in ((0.0, 0.87), (0.5, 0.85 if seed < 3 else 0.7))]
    curves = pd.DataFrame(rows)
    ad = pd.DataFrame({"task": ["amazon"], "threshold": [0.9], "level": [0.5], "mlm_loss_increase": [0.04],
                       "full_score": [0.87]})
    ba = pd.DataFrame({"task": ["amazon"], "level": [0.5], "setting": ["prune (mlm) then fine-tune"],
                       "score": [0.84], "score_std": [0.01], "n": [3], "n_total": [3]})
    tables = _tables(prunability=prunability_table(curves, 0.9), curves=curves, acceptable_deduction_summary=ad,
                     before_after=ba)
    paragraphs = transfer_summary(tables, settings).split("\n\n")
    mlm_side = [p for p in paragraphs if p.startswith(("Masked LM", "MLM vs", "Heads removable", "Acceptable"))]
    # each MLM-side sentence carries the mark; the caveat itself is said once (the report's box)
    assert len(mlm_side) == 5 and all(MARK in p.split(":", 1)[0] for p in mlm_side)
    assert not any(MARK in p or caveat in p for p in paragraphs if p.startswith("Task vs task"))
    assert not any("fitted on the frozen encoder" in p for p in paragraphs)
    assert transfer_caveats(tables) == [caveat + ", not evidence about masked-LM pre-training as such."]
    ci = sps.binomtest(165, 1500).proportion_ci(method="wilson")
    assert f"accuracy 0.11 [{ci.low:.2f}, {ci.high:.2f}] (Wilson interval over 1,500 masked tokens" in paragraphs[0]
    # the removable shares with their spread over seeds; the deduction with the score it rests on
    removable = next(p for p in paragraphs if p.startswith("Heads removable"))
    assert "amazon: task 50%, mlm 50%, random 50% (each seed's curve, mean ± std: task 33% ± 29% (n=3)" in removable
    deduction = deduction_sentence(tables, settings, caveat)
    assert "amazon: 50% of heads, MLM loss +0.04 (fine-tuned score there 0.84 ± 0.01, n=3, against 0.9 x full = 0.78)" \
        in deduction
    assert prunability_sentence(_tables(), settings) == ""


def test_a_checkpoint_head_is_named_as_such():
    own = MLM.assign(head="checkpoint")
    assert mlm_caveat({"mlm": own}) == "† the checkpoint's own MLM head, masked-token accuracy 0.11 (amazon)"
    assert "not in this run's tables" in mlm_caveat({})
    assert transfer_caveats({"mlm": own}) == [mlm_caveat({"mlm": own}) + "."]
    assert re.search(r"its own head\)\.$", transfer_summary(_tables(mlm=own), T.TransferSettings(
        tasks=["offline/movies"], seeds=[1, 2])).split("\n\n")[0])
