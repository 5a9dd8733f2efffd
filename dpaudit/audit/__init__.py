"""Audit statistics for membership attacks and DP-SGD, in NumPy and SciPy only.

Convention: a *higher* score means "member".

Metrics (:mod:`~dpaudit.audit.metrics`): ROC curve, AUC, TPR at FPR (with an explicit
"not enough non-members" result), balanced accuracy, seeded bootstrap intervals.

Bounds (:mod:`~dpaudit.audit.bounds`), pure functions of counts, keyword-only:

* :func:`epsilon_clopper_pearson` -- Jagielski et al. 2020 (many training runs)
* :func:`epsilon_one_run` -- Steinke, Nasr, Jagielski 2023 (one run)
* :func:`epsilon_one_run_fdp` -- Mahloujifar, Melis, Chaudhuri 2025 (one run, f-DP)
* :func:`epsilon_from_gdp` -- Nasr et al. 2023 with Dong, Roth, Su 2019 (Gaussian DP)
* ``"order_statistics"`` (:mod:`~dpaudit.audit.bound_order_statistics`) -- Xiang et al.
  2025 (one run, independent Gaussian channels)

Each bound is registered by name (:func:`register_bound`, :func:`get_bound`,
:func:`available_bounds`) with its family ("one_run" or "threshold") and whether it is
*sound* (holds for any (epsilon, delta)-DP mechanism: "one_run", "clopper_pearson") or an
estimate under an assumption: a Gaussian trade-off curve ("one_run_fdp", "gdp"), or
independent channels, one per canary ("order_statistics", which a mechanism with shared
noise breaks).

:class:`CanaryScores` holds in/out canary scores and gives every metric and bound, the
threshold or guess counts chosen by an explicit strategy (:class:`SplitStrategy`, or
:class:`BonferroniStrategy`, the default). :func:`ceiling_table` says the largest bound
each method can give with m canaries; :func:`one_run_ceiling` the largest one run's
strategy can give. :func:`decide` turns bounds, the claim and the ceiling into a
:class:`Verdict` ("violated", "consistent", "inconclusive" or "no_claim").

Two samples of a mechanism's output (:mod:`~dpaudit.audit.two_sample`, the white-box step
audit of Nasr et al. 2023): :func:`two_sample_mu_bound` (a rigorous Gaussian-DP mu bound,
threshold test chosen on a split, Clopper-Pearson) and :func:`gaussian_mu_estimate` (an
estimate with its interval under a Gaussian assumption).

White-box gradient canaries of one DP-SGD run (:mod:`~dpaudit.audit.gradient_canaries`,
Steinke et al. 2023): :class:`GradientCanaryRecord` (their scores, membership and inclusion
counts) and :func:`inclusion_check` (their inclusions against the claimed Poisson sampler).
"""

from dpaudit.audit.bounds import (
    clopper_pearson_upper,
    epsilon_clopper_pearson,
    epsilon_from_gdp,
    epsilon_one_run,
    epsilon_one_run_fdp,
    fdp_one_run_rejects,
    gdp_delta,
    gdp_epsilon,
    gdp_mu_lower_bound,
    mu_one_run_fdp,
    one_run_p_value,
)
from dpaudit.audit.canary_scores import CanaryScores
from dpaudit.audit.catalog import available_bounds, get_bound
from dpaudit.audit.ceilings import (
    CeilingRow,
    ceiling_table,
    claimed_curve_ceiling,
    format_ceiling_table,
    one_run_ceiling,
)
from dpaudit.audit.claimed_curve import claimed_curve_bound, claimed_curve_rejects
from dpaudit.audit.gradient_canaries import GradientCanaryRecord, inclusion_check
from dpaudit.audit.metrics import (
    ConfidenceInterval,
    RocCurve,
    TprAtFpr,
    auc,
    balanced_accuracy,
    bootstrap_ci,
    required_nonmembers,
    roc_curve,
    tpr_at_fpr,
)
from dpaudit.audit.registry import BoundSpec, register_bound
from dpaudit.audit.results import AuditReport, BoundResult
from dpaudit.audit.strategy import (
    DEFAULT_FPR_GRID,
    DEFAULT_GUESS_FRACTIONS,
    DEFAULT_STRATEGY,
    BonferroniStrategy,
    SplitStrategy,
    Strategy,
)
from dpaudit.audit.tradeoff import TradeOffCurve, claimed_tradeoff_curve, tradeoff_curve_from_profile
from dpaudit.audit.two_sample import (
    TwoSampleBound,
    gaussian_mu_estimate,
    two_sample_mu_bound,
    two_sample_mu_ceiling,
)
from dpaudit.audit.assess import Claim, assess, ceilings, rung_ceiling
from dpaudit.audit.ladder import RUNGS, Rung
from dpaudit.audit.verdict import Status, Verdict, decide, fit_from_log, learned

__all__ = [
    # bounds
    "epsilon_clopper_pearson",
    "epsilon_one_run",
    "epsilon_one_run_fdp",
    "epsilon_from_gdp",
    "clopper_pearson_upper",
    "one_run_p_value",
    "fdp_one_run_rejects",
    "mu_one_run_fdp",
    "gdp_delta",
    "gdp_epsilon",
    "gdp_mu_lower_bound",
    # the claimed trade-off curve (Mahloujifar et al. 2025 against a DpEvent's PLD curve)
    "claimed_curve_bound",
    "claimed_curve_rejects",
    "claimed_tradeoff_curve",
    "tradeoff_curve_from_profile",
    "TradeOffCurve",
    # metrics
    "roc_curve",
    "auc",
    "tpr_at_fpr",
    "balanced_accuracy",
    "bootstrap_ci",
    "required_nonmembers",
    "RocCurve",
    "TprAtFpr",
    "ConfidenceInterval",
    # object and results
    "CanaryScores",
    "BoundResult",
    "AuditReport",
    # strategies
    "Strategy",
    "SplitStrategy",
    "BonferroniStrategy",
    "DEFAULT_STRATEGY",
    "DEFAULT_GUESS_FRACTIONS",
    "DEFAULT_FPR_GRID",
    # ceilings
    "ceiling_table",
    "learned",
    "format_ceiling_table",
    "CeilingRow",
    "one_run_ceiling",
    "claimed_curve_ceiling",
    # registry
    "register_bound",
    "get_bound",
    "available_bounds",
    "BoundSpec",
    # the threat-model ladder
    "RUNGS",
    "Rung",
    "rung_ceiling",
    # verdict
    "Claim",
    "Status",
    "Verdict",
    "assess",
    "ceilings",
    "decide",
    "fit_from_log",
    # two samples of a mechanism's output (the white-box step audit)
    "two_sample_mu_bound",
    "two_sample_mu_ceiling",
    "gaussian_mu_estimate",
    "TwoSampleBound",
    # white-box gradient canaries of one DP-SGD run (Steinke et al. 2023) and their sampler check
    "GradientCanaryRecord",
    "inclusion_check",
]
