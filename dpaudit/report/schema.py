"""The report's schema constants: versions, keys and the words used for units."""

SCHEMA_VERSION = 2
REPORT_FPRS = ("0.1", "0.01", "0.001")
# the TPRs the membership figure and the HTML tables show (every one of REPORT_FPRS is in tables/attacks.csv)
SHOWN_FPRS = ("0.01", "0.001")
# DESIGN.md section 4: TPR at FPR a needs about 10 / a non-members to mean anything.
MIN_NONMEMBERS_TIMES_FPR = 10.0
# Online LiRA fits per-text "in" and "out" means; with fewer reference models than this on
# either side, the report warns. Measured on the demo data: with one in and one out model
# its TPR at 1% FPR was 0.002 against 0.073 for the loss attack; with 2-3 in and 13-14 out
# it was 0.085 against 0.027.
MIN_ONLINE_MODELS = 2
# audit-model's own reference models: one whose held-out loss on the non-members exceeds the
# target's by more than this (nats a token: perplexity 1.5 times the target's) is a poor
# stand-in for the target (Carlini et al. 2022, arXiv 2112.03570, train them like the target),
# and the report warns that it weakens LiRA and RMIA.
REFERENCE_LOSS_GAP = 0.405
# relative difference between the logged and the recomputed epsilon that is flagged
MISMATCH_RTOL = 1e-4
# String fields of extraction records that are never member text.
SAFE_STRING_KEYS = frozenset({"id", "canary_id", "kind", "secret", "method", "strategy", "status", "split", "field"})
UNIT_ADJACENCY = {
    "example": "add or remove one note (one training example)",
    "user": "add or remove one patient (all of that patient's notes)",
}
UNIT_LABEL = {"example": "note-level", "user": "patient-level"}

# the rungs of the threat-model ladder (dpaudit.audit.ladder.RUNGS), as the report names them
RUNG_LABEL = {"released": "released", "input_space": "input-space", "white_box": "white-box"}

MODEL_KEYS = ("name", "error", "privacy", "dp", "utility", "train_checks", "attacks", "canary_attacks",
              "audit", "rungs", "extraction", "verdict", "multi_run", "groups", "warnings")
DP_KEYS = ("enabled", "noise_multiplier", "sample_rate", "steps", "max_grad_norm", "unit", "delta", "epsilon",
           "accountant", "expected_batch_size", "num_units", "trainer")
