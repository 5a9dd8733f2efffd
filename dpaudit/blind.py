"""Blind baseline: how well members and non-members are told apart without the model.

Membership audits of released models use a natural split: texts known to be in the
training data against texts believed to be out. When the two sides differ in distribution
(dates, topics, sources, lengths), a classifier that never looks at the model separates
them: on WikiMIA a bag-of-words baseline reaches AUC 0.99, above every published attack
(Das, Zhang, Tramèr 2024, "Blind Baselines Beat Membership Inference Attacks for Foundation
Models", arXiv 2406.16201; Duan et al. 2024, "Do Membership Inference Attacks Work on Large
Language Models?", arXiv 2402.07841). An attack's AUC on such a split is then no evidence of
memorization, and no epsilon may ever be derived from it: epsilon comes only from canaries
whose inclusion was randomized.

:func:`blind_baseline` fits a bag of word n-grams and character n-grams (TF-IDF) with a
logistic regression (scikit-learn), scores every text out of fold (stratified k-fold
cross-validation, so no text is scored by a model that saw it) and reports the AUC with a
bootstrap interval; the same for the texts' lengths alone.

The flags. A split is *shifted* when the classifier's interval lies wholly above
``0.5 + MARGIN``; its lengths differ when the interval of the length AUC lies wholly outside
``[0.5 - MARGIN, 0.5 + MARGIN]`` (a length is scored directly, so both directions mean a
difference). The interval covers the sampling noise of the AUC; the margin (0.02) absorbs
what it misses, the optimism of a model selected on few texts. Only the upper side flags a
shift: out-of-fold scores pooled over folds are pessimistic on exchangeable data (each
fold's model is trained with fewer texts of its test texts' class, and a grouped split with
few groups shows it most: AUC 0.38 on the tiny preset's random split by patient), so an AUC
below 0.5 is that artifact, not a signal that separates the files. A shift of 0.02 AUC is
as large as the gains published attacks report over the loss attack on real LLM splits
(Duan et al. 2024), so a smaller margin would not change the reading of any attack.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from dpaudit.errors import InputError

__all__ = ["MARGIN", "blind_baseline"]

MARGIN = 0.02


def _auc_with_ci(scores: np.ndarray, labels: np.ndarray, *, seed: int) -> tuple[float, list[float]]:
    import warnings

    from dpaudit.audit import CanaryScores

    with warnings.catch_warnings():  # an AUC far below 0.5 is a finding here (shorter members), not a sign error
        warnings.simplefilter("ignore", UserWarning)
        cs = CanaryScores.from_labels(scores=scores, is_member=labels, seed=seed)
    ci = cs.bootstrap_ci("auc", num_samples=200, confidence=0.95, seed=seed)
    return float(cs.auc()), [float(ci.low), float(ci.high)]


def _off_chance(ci: list[float], *, both_sides: bool) -> bool:
    return ci[0] > 0.5 + MARGIN or (both_sides and ci[1] < 0.5 - MARGIN)


def blind_baseline(*, members: Sequence[str], nonmembers: Sequence[str], folds: int = 5, seed: int = 0,
                   groups: Sequence[str] | None = None) -> dict[str, Any]:
    """The model-free baseline of a member / non-member split (Das et al. 2024, arXiv
    2406.16201): out-of-fold scores (higher = member) of a logistic regression on TF-IDF
    word 1-2-grams and character 2-4-grams, ``folds``-fold stratified cross-validation.

    Returns ``{"auc", "auc_ci", "length_auc", "length_auc_ci", "shifted", "length_differs",
    "folds", "features", "margin"}``: ``auc`` of the classifier, ``length_auc`` of the
    character count alone as the score, each with a 95% bootstrap interval; ``shifted`` /
    ``length_differs`` when that interval lies above 0.5 + :data:`MARGIN` (shifted) or outside
    0.5 +- :data:`MARGIN` (lengths).

    ``groups`` (one per text, members first): texts of one person (or any unit) stay in one
    fold (stratified group k-fold). Without it, several records of one person in a file let
    the classifier learn that person's name or MRN in one fold and recognise the others:
    a split that is random by person then looks shifted.
    """
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import (
        StratifiedGroupKFold,
        StratifiedKFold,
        cross_val_predict,
    )
    from sklearn.pipeline import make_pipeline, make_union

    members, nonmembers = list(members), list(nonmembers)
    if isinstance(folds, bool) or not isinstance(folds, int) or folds < 2:
        raise InputError(f"blind_baseline: folds must be an integer >= 2, got {folds!r}")
    if min(len(members), len(nonmembers)) < folds:
        raise InputError(f"blind_baseline: needs at least {folds} members and {folds} non-members "
                         f"(got {len(members)} and {len(nonmembers)})")
    texts = members + nonmembers
    labels = np.array([True] * len(members) + [False] * len(nonmembers))
    model = make_pipeline(
        make_union(TfidfVectorizer(analyzer="word", ngram_range=(1, 2), sublinear_tf=True),
                   TfidfVectorizer(analyzer="char_wb", ngram_range=(2, 4), sublinear_tf=True)),
        LogisticRegression(C=1.0, solver="liblinear"),
    )
    if groups is None:
        cv = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
    else:
        groups = [str(g) for g in groups]
        if len(groups) != len(texts):
            raise InputError(f"blind_baseline: {len(groups)} groups for {len(texts)} texts")
        if min(len({g for g, y in zip(groups, labels) if y}), len({g for g, y in zip(groups, labels) if not y})) < folds:
            raise InputError(f"blind_baseline: needs at least {folds} groups of members and of non-members")
        cv = StratifiedGroupKFold(n_splits=folds, shuffle=True, random_state=seed)
    scores = cross_val_predict(model, texts, labels, cv=cv, method="decision_function", groups=groups)
    auc, ci = _auc_with_ci(np.asarray(scores, dtype=np.float64), labels, seed=seed)
    lengths = np.array([len(t) for t in texts], dtype=np.float64)
    length_auc, length_ci = _auc_with_ci(lengths, labels, seed=seed)
    return {
        "auc": auc, "auc_ci": ci, "shifted": _off_chance(ci, both_sides=False),
        "length_auc": length_auc, "length_auc_ci": length_ci, "length_differs": _off_chance(length_ci, both_sides=True),
        "folds": folds, "margin": MARGIN, "grouped": groups is not None,
        "features": "TF-IDF word 1-2-grams + character 2-4-grams, logistic regression (scikit-learn)",
        "mean_length": {"members": float(lengths[labels].mean()), "nonmembers": float(lengths[~labels].mean())},
    }
