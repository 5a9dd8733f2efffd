"""The inputs every membership attack takes, and the base class of attacks.

Conventions (the whole package follows them):

* An attack scores the ``n`` candidate texts of :class:`AttackInputs`; the score is a
  float64 array of shape ``[n]`` and **higher means member**.
* An attack class stores its keyword-only parameters in ``__init__`` and nothing else
  (scikit-learn style); :meth:`Attack.get_params` returns them. Parameters are checked
  when the attack is built through :func:`dpaudit.attacks.get_attack` and again before
  scoring.
* ``requires`` names what an attack needs beyond the target signals, out of
  ``{"texts", "references", "reference_keep", "population"}``; scoring inputs that lack
  one raises :class:`~dpaudit.errors.InputError` naming it.
* Attacks are deterministic functions of their inputs and never modify them (the arrays
  inside :class:`~dpaudit.signals.TokenSignals` and :class:`AttackInputs` are read-only
  views).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import ClassVar, Sequence

import numpy as np

from dpaudit.errors import InputError
from dpaudit.signals.tokens import TokenSignals

__all__ = ["REQUIREMENTS", "Attack", "AttackInputs"]

#: Everything an attack may declare in ``requires``.
REQUIREMENTS = frozenset({"texts", "references", "reference_keep", "population"})


def _readonly(a: np.ndarray) -> np.ndarray:
    v = a.view()
    v.flags.writeable = False
    return v


@dataclass(frozen=True, eq=False)
class AttackInputs:
    """What attacks score: the target model's signals of ``n`` candidate texts, and
    optionally the texts, reference models' signals of the same texts and a population.

    Attributes:
        target: signals of the ``n`` candidates under the audited (target) model.
        texts: the ``n`` candidate texts (the ``zlib`` attack needs them).
        references: ``m`` signals; ``references[j]`` holds the same ``n`` texts, in the
            same order, under reference model ``j``. Reference models may use another
            tokenizer: attacks compare sequence-level statistics only.
        reference_keep: bool ``[m, n]``; ``reference_keep[j, i]`` is True when text ``i``
            was in reference model ``j``'s training set. ``None`` means every reference
            model was trained on data disjoint from the candidates ("out" models, as when
            a released model is audited against public reference models).
        population_target: signals of extra population texts (non-members of the target)
            under the target model; RMIA compares each candidate against them.
        population_references: the population texts under each reference model (one per
            entry of ``references``, same order). The population texts are assumed to be
            in no reference model's training set.
    """

    target: TokenSignals
    texts: Sequence[str] | None = None
    references: Sequence[TokenSignals] = ()
    reference_keep: np.ndarray | None = None
    population_target: TokenSignals | None = None
    population_references: Sequence[TokenSignals] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.target, TokenSignals):
            raise InputError(f"AttackInputs.target must be TokenSignals, got {type(self.target).__name__}")
        n = self.target.n
        if self.texts is not None:
            if isinstance(self.texts, (str, bytes)):
                raise InputError("AttackInputs.texts must be a sequence of strings, not one string")
            texts = tuple(self.texts)
            if len(texts) != n:
                raise InputError(f"AttackInputs.texts has {len(texts)} texts for {n} target rows")
            if not all(isinstance(t, str) for t in texts):
                raise InputError("AttackInputs.texts must all be strings")
            object.__setattr__(self, "texts", texts)
        refs = tuple(self.references)
        for j, r in enumerate(refs):
            if not isinstance(r, TokenSignals):
                raise InputError(f"AttackInputs.references[{j}] must be TokenSignals")
            if r.n != n:
                raise InputError(f"AttackInputs.references[{j}] has {r.n} rows, the target has {n}")
        object.__setattr__(self, "references", refs)
        if self.reference_keep is not None:
            keep = np.asarray(self.reference_keep)
            if keep.dtype != np.bool_:
                raise InputError(f"AttackInputs.reference_keep must be boolean, got {keep.dtype}")
            if not refs:
                raise InputError("AttackInputs.reference_keep given without references")
            if keep.shape != (len(refs), n):
                raise InputError(
                    f"AttackInputs.reference_keep has shape {keep.shape}, expected "
                    f"({len(refs)}, {n}) = (references, candidates)"
                )
            object.__setattr__(self, "reference_keep", _readonly(keep))
        pop_refs = tuple(self.population_references)
        if self.population_target is None:
            if pop_refs:
                raise InputError("AttackInputs.population_references given without population_target")
        else:
            if not isinstance(self.population_target, TokenSignals):
                raise InputError("AttackInputs.population_target must be TokenSignals")
            if len(pop_refs) != len(refs):
                raise InputError(
                    f"AttackInputs has {len(refs)} references but {len(pop_refs)} "
                    "population_references (need one per reference model)"
                )
            n_pop = self.population_target.n
            for j, r in enumerate(pop_refs):
                if not isinstance(r, TokenSignals):
                    raise InputError(f"AttackInputs.population_references[{j}] must be TokenSignals")
                if r.n != n_pop:
                    raise InputError(
                        f"AttackInputs.population_references[{j}] has {r.n} rows, "
                        f"population_target has {n_pop}"
                    )
        object.__setattr__(self, "population_references", pop_refs)

    @property
    def n(self) -> int:
        """Number of candidates."""
        return self.target.n

    @property
    def n_references(self) -> int:
        return len(self.references)

    def available(self) -> frozenset[str]:
        """The requirement names these inputs satisfy."""
        have = set()
        if self.texts is not None:
            have.add("texts")
        if self.references:
            have.add("references")
        if self.reference_keep is not None:
            have.add("reference_keep")
        if self.population_target is not None:
            have.add("population")
        return frozenset(have)


class Attack:
    """Base class of membership-inference attacks. Subclasses set ``requires``, define
    ``__init__`` with keyword-only parameters that it only stores, and implement
    ``_score``; :func:`dpaudit.attacks.register` sets ``name``.
    """

    name: ClassVar[str] = ""
    requires: ClassVar[frozenset[str]] = frozenset()

    # -- parameters ---------------------------------------------------------------------
    @classmethod
    def _param_names(cls) -> list[str]:
        sig = inspect.signature(cls.__init__)
        return [p.name for p in sig.parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY]

    def get_params(self) -> dict:
        """The keyword parameters this attack was built with (``type(a)(**a.get_params())``
        builds an equal attack)."""
        return {k: getattr(self, k) for k in self._param_names()}

    def validate_params(self) -> None:
        """Raise :class:`InputError` for a bad parameter value. Default: nothing to check."""

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({params})"

    # -- requirements --------------------------------------------------------------------
    def missing(self, inputs: AttackInputs) -> list[str]:
        """What ``inputs`` lack for this attack (empty when it can run)."""
        return sorted(self.requires - inputs.available())

    def can_run(self, inputs: AttackInputs) -> bool:
        """True when ``inputs`` hold everything this attack needs."""
        return not self.missing(inputs)

    # -- scoring -------------------------------------------------------------------------
    def score(self, inputs: AttackInputs) -> np.ndarray:
        """Membership scores of the ``inputs.n`` candidates: float64 ``[n]``, higher = member."""
        if not isinstance(inputs, AttackInputs):
            raise InputError(f"{self.name or type(self).__name__}.score takes AttackInputs, got {type(inputs).__name__}")
        missing = self.missing(inputs)
        if missing:
            raise InputError(f"attack {self.name!r} needs {', '.join(missing)}, which the inputs lack")
        self.validate_params()
        scores = np.asarray(self._score(inputs), dtype=np.float64)
        if scores.shape != (inputs.n,):
            raise AssertionError(f"attack {self.name!r} returned shape {scores.shape}, expected ({inputs.n},)")
        if np.isnan(scores).any():
            raise InputError(
                f"attack {self.name!r} produced {int(np.isnan(scores).sum())} NaN scores; "
                "the signals hold NaN values"
            )
        return scores

    def _score(self, inputs: AttackInputs) -> np.ndarray:
        raise NotImplementedError


# ----------------------------------------------------------------------------------------
# helpers shared by the attack modules
# ----------------------------------------------------------------------------------------


def sequence_logprob(signals: TokenSignals, what: str) -> np.ndarray:
    """Mean token log-probability of each text (float64 ``[n]``); InputError if a text has
    no scored token (the statistic is undefined)."""
    phi = signals.mean_logprob()
    empty = np.flatnonzero(signals.token_count() == 0)
    if empty.size:
        raise InputError(
            f"{what}: {empty.size} text(s) have no scored token (fewer than two tokens), "
            f"e.g. index {int(empty[0])}; drop them before attacking"
        )
    return phi


def reference_logprobs(references: Sequence[TokenSignals], what: str = "references") -> np.ndarray:
    """Mean token log-probabilities under each reference model, float64 ``[m, n]``."""
    return np.stack([sequence_logprob(r, f"{what}[{j}]") for j, r in enumerate(references)])


@dataclass(frozen=True)
class InOut:
    """Per-candidate summaries of reference statistics split by membership."""

    mean_in: np.ndarray  # [n]; NaN where n_in == 0
    mean_out: np.ndarray  # [n]; NaN where n_out == 0
    n_in: np.ndarray  # [n] int
    n_out: np.ndarray  # [n] int
    var_in: np.ndarray  # [n] sample variance (ddof=1); NaN where n_in < 2
    var_out: np.ndarray
    pooled_var_in: float  # within-candidate pooled variance; NaN without degrees of freedom
    pooled_var_out: float


def split_in_out(values: np.ndarray, keep: np.ndarray | None) -> InOut:
    """Means and variances of ``values`` [m, n] over the reference models that had each
    candidate in (``keep`` True) and out of their training set. ``keep=None``: all out."""
    values = np.asarray(values, dtype=np.float64)
    keep = np.zeros(values.shape, dtype=bool) if keep is None else np.asarray(keep, dtype=bool)

    def group(sel):
        cnt = sel.sum(axis=0)
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.where(sel, values, 0.0).sum(axis=0) / cnt
            ss = np.where(sel, (values - np.where(cnt > 0, mean, 0.0)) ** 2, 0.0).sum(axis=0)
            var = np.where(cnt >= 2, ss / np.maximum(cnt - 1, 1), np.nan)
        df = int(cnt.sum() - (cnt > 0).sum())
        pooled = float(ss.sum() / df) if df > 0 else float("nan")
        return mean, cnt, var, pooled

    mi, ni, vi, pi = group(keep)
    mo, no, vo, po = group(~keep)
    return InOut(mi, mo, ni, no, vi, vo, pi, po)


def fill_missing_means(
    stats: InOut, attack: str, *, need_in: bool = True, need_out: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """(mean_in, mean_out) with the gaps of the needed groups filled: a candidate with no
    "in" (or no "out") reference model gets the other group's mean shifted by the average
    in-minus-out gap of the candidates that have both. InputError if such a gap exists and
    no candidate has both. Groups not needed are returned as they are (NaN gaps).
    """
    mean_in, mean_out = stats.mean_in.copy(), stats.mean_out.copy()
    no_in = (stats.n_in == 0) if need_in else np.zeros_like(stats.n_in, dtype=bool)
    no_out = (stats.n_out == 0) if need_out else np.zeros_like(stats.n_out, dtype=bool)
    if not (no_in.any() or no_out.any()):
        return mean_in, mean_out
    both = (stats.n_in > 0) & (stats.n_out > 0)
    if not both.any():
        group = "out" if no_out.any() else "in"
        raise InputError(
            f"attack {attack!r}: {int((no_out | no_in).sum())} candidate(s) have no '{group}' "
            "reference model and no candidate has both an 'in' and an 'out' one; check reference_keep"
        )
    gap = float(np.mean(stats.mean_in[both] - stats.mean_out[both]))
    mean_in[no_in] = stats.mean_out[no_in] + gap
    mean_out[no_out] = stats.mean_in[no_out] - gap
    return mean_in, mean_out
