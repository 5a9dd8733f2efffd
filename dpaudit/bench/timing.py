"""The clock of the rows: engine steps timed in interleaved rounds, ratios paired by round,
and a wall-clock budget that stops a suite in time.

On CPU the clock is the process's CPU time (with one thread, the work done, whatever else the
machine runs); on CUDA it is the wall time, synchronized.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from dpaudit.bench.engines import make_engine
from dpaudit.progress import Progress


def set_threads(device: torch.device, *, threads: int) -> None:
    """On CPU, torch on ``threads`` threads (0: as it is) and, with one, the tokenizer too:
    its thread pool's waiting counts as CPU time, not work."""
    if device.type == "cpu" and threads:
        torch.set_num_threads(threads)
        if threads == 1:
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def sync(device: torch.device) -> None:
    """Wait for the work queued on ``device`` (CUDA; nothing to wait for on a CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def clock(device: torch.device) -> Callable[[], float]:
    """The rows' clock: ``time.process_time`` on CPU, ``time.perf_counter`` on CUDA."""
    return time.process_time if device.type == "cpu" else time.perf_counter


@contextlib.contextmanager
def training_steps(factory, model, units, *, batch: int, microbatch: int, device: torch.device, private: bool,
                   autocast_dtype=None, secure: bool = False, restore: bool = True) -> Iterator[Callable[[], None]]:
    """A function that runs one training step as the training loop does: the engine's step on
    ``units`` and AdamW's. The noise comes from a seeded torch generator on ``device``, or, with
    ``secure``, from :class:`~dpaudit.train.sampling.SecureGenerator` (secure mode, the default
    of DP training), whose nonces move on at every step. With ``restore`` the model's weights are
    restored on exit (from a copy taken first), so every engine starts from the same model."""
    from dpaudit.train.sampling import SecureGenerator

    state = {k: v.clone() for k, v in model.state_dict().items()} if restore else None
    engine = make_engine(factory, model, batch=batch, microbatch=microbatch, device=device, private=private,
                         autocast_dtype=autocast_dtype)
    optimizer = torch.optim.AdamW(list(engine.params.values()), lr=1e-5)
    generator = SecureGenerator(device) if secure else torch.Generator(device=device).manual_seed(0)

    def step() -> None:
        if secure:
            generator.next_step()
        engine.step(units, generator)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    try:
        yield step
    finally:
        engine.close()
        if state is not None:
            model.load_state_dict(state)


def time_steps(factory, model, units, *, batch: int, microbatch: int, device: torch.device, private: bool,
               steps: int, autocast_dtype=None, secure: bool = False, restore: bool = True) -> list[float]:
    """Seconds of ``steps`` steps of :func:`training_steps` (the other arguments are its) after
    one warm-up step (:func:`timed`)."""
    with training_steps(factory, model, units, batch=batch, microbatch=microbatch, device=device, private=private,
                        autocast_dtype=autocast_dtype, secure=secure, restore=restore) as step:
        return timed(step, steps=steps, device=device)


def timed(step: Callable[[], None], *, steps: int, device: torch.device) -> list[float]:
    """Seconds of ``steps`` calls of ``step`` after one warm-up call, by :func:`clock`
    (synchronized on CUDA)."""
    now = clock(device)
    times = []
    for i in range(steps + 1):
        sync(device)
        start = now()
        step()
        sync(device)
        if i > 0:
            times.append(now() - start)
    return times


class Budget:
    """A wall-clock budget of ``seconds`` for a suite of rows, counted from its creation. A row
    starts only while more than the time it needs is left (:meth:`skip_reason`), and a row of
    rounds stops after the round in which the budget ran out (:meth:`stop`): a suite overruns
    it by about one round of one row."""

    def __init__(self, seconds: float):
        self.seconds, self.start = float(seconds), time.perf_counter()
        self.row: str | None = None
        self.skipped: list[str] = []
        self.rounds_made: dict[str, int] = {}

    def spent(self) -> float:
        return time.perf_counter() - self.start

    def left(self) -> float:
        return self.seconds - self.spent()

    def skip_reason(self, row: str, *, need: float = 0.0) -> str | None:
        """None when row ``row`` may start (and it becomes the current row), else why not."""
        self.row = row
        if self.left() > need:
            return None
        self.skipped.append(row)
        needs = f"; it needs about {need:.0f} s" if need else ""
        return f"skipped: {self.spent():.0f} s of the {self.seconds:.0f} s budget spent{needs}"

    def stop(self, done: int) -> bool:
        """True when the current row should stop after ``done`` rounds (at least one)."""
        if done == 0 or self.left() > 0:
            return False
        self.rounds_made[self.row or "?"] = done
        return True

    def record(self) -> dict[str, Any]:
        """The budget, the seconds spent, the rows skipped and the rounds made by rows cut short."""
        return {"seconds": self.seconds, "spent_s": self.spent(), "skipped": self.skipped,
                "rounds_made": self.rounds_made}


def run_row(measure: Callable[[], None], *, name: str, keys: tuple[str, ...], result: dict[str, Any],
            reasons: dict[str, str], budget: Budget | None = None, need: float = 0.0, keep_going: bool = False) -> None:
    """Row ``name``: ``measure()``, unless ``budget`` has ``need`` seconds or less left (then
    each of the row's ``keys`` gets the reason); with ``keep_going``, an error of ``measure``
    becomes the reason of those ``keys`` it left null in ``result``, and the suite goes on."""
    skipped = budget.skip_reason(name, need=need) if budget is not None else None
    if skipped:
        reasons.update({key: skipped for key in keys})
        return
    try:
        measure()
    except Exception as err:  # noqa: BLE001 - with keep_going, a row's error is its reason
        if not keep_going:
            raise
        reasons.update({key: error_text(err) for key in keys if result.get(key) is None})


def interleaved(names: list[str], run: Callable[[str], list[float]], *, rounds: int, bar: Progress,
                errors: dict[str, str], budget: Budget | None = None) -> dict[str, list[float]]:
    """Per name, the median seconds per step of each of ``rounds`` interleaved rounds (fewer
    when ``budget`` runs out); a name whose engine fails is dropped, with its error in ``errors``."""
    times: dict[str, list[float]] = {name: [] for name in names}
    for done in range(rounds):
        if budget is not None and budget.stop(done):
            break
        for name in names:
            if name in errors:
                continue
            try:
                times[name].append(statistics.median(run(name)))
            except Exception as err:  # noqa: BLE001 - another library's engine: recorded as the reason
                errors[name] = error_text(err)
            bar.update(1)
    return {name: t for name, t in times.items() if t and name not in errors}


def error_text(err: BaseException) -> str:
    """``Type: first line of the message``, at most 300 characters: an error as a reason."""
    return f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:300]


def paired_ratio(times: dict[str, list[float]], a: str, b: str) -> float | None:
    """The median over rounds of ``a``'s time over ``b``'s in the same round; None when
    either was not measured."""
    if a not in times or b not in times:
        return None
    return statistics.median(x / y for x, y in zip(times[a], times[b]))


def medians(times: dict[str, list[float]]) -> dict[str, float]:
    """Median seconds per step of each name, over its rounds."""
    return {name: statistics.median(t) for name, t in times.items()}
