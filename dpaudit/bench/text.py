"""The printed summaries of both suites."""

from __future__ import annotations

from typing import Any

from dpaudit.bench import workload

# dp_step_over_opacus: at most 1.05 times its floor, the non-private step over Opacus' hooks
# (``details.nonprivate_over_opacus``; benchmarks/README.md says why it cannot go lower)
GOALS = {"dp_step_over_nonprivate": "<= 1.05", "dp_step_over_nonprivate_b256": "<= 1.3",
         "dp_memory_over_nonprivate": "<= 1.3", "dp_step_over_opacus": "<= 1.05 x floor",
         "dp_step_over_opacus_ghost": "<= 1.0", "signals_over_forward": "<= 1.11",
         "validate_over_training": "<= 1.5"}


def summary(result: dict[str, Any]) -> str:
    """The human-readable table of :func:`~dpaudit.bench.rows.run_bench`'s result."""
    lines = [(f"model {result['model']} on {result['device']} ({result['precision']}, {result['threads']} thread(s)), "
              f"batch {result['batch_size']} x {workload.LENGTH} tokens; medians of paired interleaved rounds, "
              f"{result['clock']}")]
    for key, goal in GOALS.items():
        value = result[key]
        text = f"{value:.3f}" if value is not None else f"n/a ({result['reasons'].get(key, 'not measured')})"
        lines.append(f"  {key:<30} {text:<10} goal {goal}")
    floor = result["details"].get("nonprivate_over_opacus")
    if floor is not None:
        lines.append(f"  floor of dp_step_over_opacus (the non-private step over Opacus' hooks): {floor:.3f}, "
                     f"goal {1.05 * floor:.3f}")
    seconds = result["details"].get("seconds_per_step", {})
    lines.append("  seconds per step: " + ", ".join(f"{k} {v:.3f}" for k, v in seconds.items()))
    return "\n".join(lines)


def gpu_summary(result: dict[str, Any]) -> str:
    """The human-readable form of :func:`~dpaudit.bench.gpu.run_gpu_check`'s result: its own
    rows, then the default suite's table."""
    hardware, reasons = result["hardware"], result["reasons"]
    where = f"{hardware['gpu'] or result['device']} (torch {hardware['torch']}, CUDA {hardware['cuda']})"
    lines = [f"gpu check on {where}, {hardware['date']}: model {result['model']}, {result['precision']}, "
             f"{result['clock']}; {result['wall_s']:.0f} s of wall time"]

    def figure(key: str, text: str) -> str:
        return text.format(result[key]) if result[key] is not None else f"n/a ({reasons.get(key, 'not measured')})"

    tokens = f"batch {result['batch_size']} x {result['length']} tokens"
    lines.append(f"  non-private training  {figure('nonprivate_tokens_per_s', '{:,.0f} tokens/s')}, {tokens}, "
                 f"peak {figure('nonprivate_peak_gpu_bytes', '{:,} bytes')}")
    lines.append(f"  DP-SGD, secure noise  {figure('dp_tokens_per_s', '{:,.0f} tokens/s')}, "
                 f"peak {figure('dp_peak_gpu_bytes', '{:,} bytes')}")
    lines.append(f"  DP-SGD, seeded noise  {figure('dp_tokens_per_s_reproducible', '{:,.0f} tokens/s')}")
    lines.append(f"  secure noise share of a DP step: {figure('secure_noise_share', '{:.3f}')}")
    skipped = result["budget"]["skipped"]
    if skipped:
        lines.append(f"  skipped for the {result['budget']['seconds']:.0f} s budget: {', '.join(skipped)}")
    return "\n".join(lines + [summary(result["bench"])])
