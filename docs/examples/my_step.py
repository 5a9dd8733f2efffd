"""A step plug-in: one DP-SGD update as your code makes it, audited by ``dpaudit validate --step``.

From this directory:

    dpaudit validate --step my_step:step --noise-multiplier 1.0 --max-grad-norm 1.0 \
        --expected-batch-size 4 --repetitions 40 --json
"""

from dpaudit.train.opacus import dpsgd_step

NOISE_MULTIPLIER, MAX_GRAD_NORM, EXPECTED_BATCH_SIZE, LR = 1.0, 1.0, 4, 0.1


def step(model, batch, *, generator):
    """One update of ``model`` on ``batch``, its noise drawn from ``generator``: here Opacus's
    GradSampleModule and DPOptimizer (replace the body with your own step)."""
    print(f"DP-SGD step, noise multiplier {NOISE_MULTIPLIER}")  # with --json this lands on stderr
    dpsgd_step(model, batch, generator=generator, noise_multiplier=NOISE_MULTIPLIER, max_grad_norm=MAX_GRAD_NORM,
               expected_batch_size=EXPECTED_BATCH_SIZE, lr=LR)
