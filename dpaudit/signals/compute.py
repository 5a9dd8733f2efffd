"""Computing per-token signals: batched forward passes of causal LMs (torch).

See :mod:`dpaudit.signals` for the quantities.
"""

from __future__ import annotations

import contextlib
from typing import Iterable, Sequence

import numpy as np
import torch

from dpaudit.devices import place_model, resolve_device
from dpaudit.errors import InputError
from dpaudit.signals.tokens import TokenSignals

# On CPU the per-token statistics are computed on slices of the logits small enough to
# stay in cache (a few passes over each slice cost little once it is there). On GPU the
# slices only bound the temporary memory.
_CPU_CHUNK_BYTES = 1 << 19
_GPU_CHUNK_ELEMENTS = 1 << 27
_CPU_HEAD_ROWS = 256  # least rows per slice when the slices' logits come from the head

#: The dtype the model body runs in under autocast, by device type (none on CPU: a float32
#: forward there is as fast). Tests add "cpu" to run the bf16 path on CPU.
_AUTOCAST: dict[str, torch.dtype] = {"cuda": torch.bfloat16}


def check_texts(texts) -> list[str]:
    """``texts`` as a list of strings; InputError for a single string or a non-string item."""
    if isinstance(texts, (str, bytes)):
        raise InputError("texts must be a sequence of strings, not a single string")
    out = list(texts)
    bad = [i for i, t in enumerate(out) if not isinstance(t, str)]
    if bad:
        raise InputError(f"texts must be strings; item {bad[0]} is {type(out[bad[0]]).__name__}")
    return out


def check_sizes(batch_size: int, max_length: int) -> None:
    if not isinstance(batch_size, int) or batch_size < 1:
        raise InputError(f"batch_size must be a positive integer, got {batch_size!r}")
    if not isinstance(max_length, int) or max_length < 2:
        raise InputError(f"max_length must be an integer >= 2, got {max_length!r}")


def _model_max_length(model, max_length: int) -> int:
    """Clamp ``max_length`` to the model's position table (GPT-2 fails beyond it)."""
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if isinstance(limit, int) and limit >= 2:
        return min(max_length, limit)
    return max_length


def _encode(tokenizer, texts: list[str], max_length: int) -> list[list[int]]:
    if not texts:
        return []
    enc = tokenizer(texts, add_special_tokens=True, truncation=True, max_length=max_length)
    return [list(ids) for ids in enc["input_ids"]]


#: Causal LMs of transformers whose logits are exactly ``lm_head(base_model(...)[0])``, the head
#: being the output embeddings (``get_output_embeddings()``) and nothing applied after it (no
#: logit scaling or softcapping, as Gemma 2, Cohere or Granite have): checked in their source.
_PLAIN_HEAD_MODELS = frozenset({
    "GPT2LMHeadModel", "LlamaForCausalLM", "OPTForCausalLM", "GPTNeoXForCausalLM",
    "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "GPTNeoForCausalLM",
    "GPTJForCausalLM", "Phi3ForCausalLM", "GemmaForCausalLM", "FalconForCausalLM",
})  # fmt: skip


def _float32_head(model):
    """``(base_model, head)`` when the logits can be recomputed from the base model's last
    hidden state as ``hidden @ head.weight.T + head.bias`` in float32; else None.

    Only for the exact classes in :data:`_PLAIN_HEAD_MODELS` (a subclass may change its
    forward; a wrapper is not one of them), with a plain ``nn.Linear`` head (not a quantised or
    adapter layer) whose weight is in memory (not offloaded to the meta device). Every other
    model falls back to its own logits, cast to float32 slice by slice (rounded to bf16 under
    autocast: its log-probs then carry errors of up to half a bf16 step of the logits).
    """
    cls = type(model)
    if cls.__name__ not in _PLAIN_HEAD_MODELS or not cls.__module__.startswith("transformers."):
        return None
    base = getattr(model, "base_model", model)
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if get_head is not None else None
    if base is model or type(head) is not torch.nn.Linear or head.weight.device.type == "meta":
        return None
    return base, head


def _batch_stats(
    logits: torch.Tensor, input_ids: torch.Tensor, lengths: np.ndarray, head: torch.nn.Linear | None = None
):
    """float32 numpy ``[3, B, Lb-1]``: logprob, mean, std; 0 beyond each text's length.

    The logits ``[B, Lb, V]`` (overwritten: this module owns them) are walked as one
    ``[B * Lb, V]`` matrix, over the rows of real tokens only (adjacent texts' rows merged
    into one run), in slices that stay in a core's L2 cache on CPU (on GPU the slices only
    bound the temporary memory). With ``head``, ``logits`` is the last hidden state
    ``[B, Lb, H]`` instead, and each slice of logits is computed from it in float32 (autocast
    off) into one reused buffer: the logits are never rounded to bf16, and never held whole
    (on CPU the slices are then at least :data:`_CPU_HEAD_ROWS` rows, so that the head's
    weight is read once per few hundred rows, not per row). Each slice ``x`` gets eight
    passes, one of them an exponential (the least any exact method needs): with
    ``y = x - max x`` (in place) and ``e = exp(y)`` (in one reused buffer, then multiplied by
    ``y`` in place, twice),

        s = sum e,    E_p[y] = sum(e y) / s,    E_p[y^2] = sum((e y) y) / s,

    so that ``log p = y - log s``, the mean of log p is ``E_p[y] - log s`` and its variance
    ``E_p[y^2] - E_p[y]^2``. Moments are taken of ``y`` (shift-invariant, and ``y`` is small
    where the mass is, so the difference does not cancel badly); float32 throughout. The
    sums land in preallocated rows and are finished once for the whole batch: no pass
    allocates a slice-sized tensor (fresh buffers cost more in page faults than the
    arithmetic), and few small operations run per slice.
    """
    if head is not None:
        bsz, seq = logits.shape[:2]
        weight = head.weight.float()  # no copy for float32 weights (the autocast case)
        bias = None if head.bias is None else head.bias.float()
        vocab, dev = weight.shape[0], weight.device
        flat = logits.reshape(bsz * seq, -1).to(dev, torch.float32)  # the hidden state, small
    else:
        bsz, seq, vocab = logits.shape
        dev = logits.device
        flat = logits.reshape(bsz * seq, vocab)  # a view when contiguous (the usual case)
    target = torch.zeros((bsz, seq), dtype=torch.long, device=dev)
    target[:, :-1] = input_ids[:, 1:].to(dev)
    target = target.view(-1, 1)  # the last position of a text has no target: computed, then masked
    # rows of raw sums: sum e, sum e y, sum e y^2, y at the target
    acc = torch.zeros((4, bsz * seq, 1), dtype=torch.float32, device=dev)
    rows = max(1, (_CPU_CHUNK_BYTES // 4 if dev.type == "cpu" else _GPU_CHUNK_ELEMENTS) // vocab)
    if head is not None and dev.type == "cpu":
        rows = max(rows, _CPU_HEAD_ROWS)
    work = torch.empty((min(rows, bsz * seq), vocab), dtype=torch.float32, device=dev)
    out = torch.empty_like(work) if head is not None else None
    runs: list[list[int]] = []
    for b in range(bsz):
        r0, r1 = b * seq, b * seq + int(lengths[b])
        if runs and runs[-1][1] == r0:
            runs[-1][1] = r1
        else:
            runs.append([r0, r1])
    for r0, r1 in runs:
        for c0 in range(r0, r1, rows):
            c1 = min(r1, c0 + rows)
            if out is None:
                y = flat[c0:c1].float()  # the model's logits (bf16 under autocast), a slice at a time
            else:
                y = out[: c1 - c0]
                with torch.autocast(dev.type, enabled=False):
                    if bias is None:
                        torch.mm(flat[c0:c1], weight.t(), out=y)
                    else:
                        torch.addmm(bias, flat[c0:c1], weight.t(), out=y)
            e = work[: c1 - c0]
            y.sub_(y.amax(dim=-1, keepdim=True))
            torch.exp(y, out=e)
            torch.sum(e, dim=-1, keepdim=True, out=acc[0, c0:c1])
            torch.sum(e.mul_(y), dim=-1, keepdim=True, out=acc[1, c0:c1])
            torch.sum(e.mul_(y), dim=-1, keepdim=True, out=acc[2, c0:c1])
            torch.gather(y, 1, target[c0:c1], out=acc[3, c0:c1])
    s, m1, m2, y_target = acc.view(4, bsz, seq)[:, :, :-1]
    keep = torch.arange(seq - 1, device=dev)[None, :] < torch.as_tensor(lengths - 1, device=dev)[:, None]
    s = torch.where(keep, s, 1.0)  # rows never computed hold 0
    log_s = s.log()
    m1 = m1 / s
    var = (m2 / s).sub_(m1 * m1).clamp_min_(0.0)
    out = torch.stack([y_target - log_s, m1 - log_s, var.sqrt_()])
    return (out * keep).cpu().numpy()


def _signals_from_ids(
    model, ids: list[list[int]], *, batch_size: int, device: torch.device, progress: bool, desc: str
) -> TokenSignals:
    from dpaudit.progress import Progress

    n = len(ids)
    lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=n)
    width = max(int(lengths.max(initial=0)) - 1, 0)
    logprob = np.zeros((n, width), dtype=np.float32)
    mean = np.zeros((n, width), dtype=np.float32)
    std = np.zeros((n, width), dtype=np.float32)
    mask = np.arange(width)[None, :] < (lengths - 1)[:, None]
    # Longest first: padding stays small, and an out-of-memory shows up at once.
    order = np.argsort(-lengths, kind="stable")

    dev = place_model(model, device)
    cast = _AUTOCAST.get(dev.type)
    autocast = torch.autocast(dev.type, dtype=cast) if cast is not None else contextlib.nullcontext()
    # Logits near -100 (GPT-2's) rounded to bf16 are off by up to 0.25 nats each: under
    # autocast, or with low-precision weights, the output layer is applied in float32.
    head = _float32_head(model)
    if head is not None and cast is None and head[1].weight.dtype == torch.float32:
        head = None  # a float32 forward: the model's own logits are float32 already
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode(), Progress(total=n, desc=desc, unit="text", enabled=progress) as bar:
            for start in range(0, n, batch_size):
                idx = order[start : start + batch_size]
                blen = lengths[idx]
                seq = int(blen.max(initial=0))
                if seq < 2:  # sorted longest first: nothing left to score
                    bar.update(n - start)
                    break
                arr = np.zeros((len(idx), seq), dtype=np.int64)  # right padding (id 0, masked)
                for row, i in enumerate(idx):
                    arr[row, : lengths[i]] = ids[i]
                att = np.arange(seq)[None, :] < blen[:, None]
                input_ids = torch.from_numpy(arr).to(dev, non_blocking=True)
                attention_mask = torch.from_numpy(att.astype(np.int64)).to(dev, non_blocking=True)
                with autocast:
                    if head is None:
                        logits = model(
                            input_ids=input_ids, attention_mask=attention_mask, use_cache=False
                        ).logits
                    else:  # the body only: the head runs in float32 in _batch_stats
                        logits = head[0](
                            input_ids=input_ids, attention_mask=attention_mask, use_cache=False
                        )[0]
                stats = _batch_stats(logits, input_ids, blen, None if head is None else head[1])
                del logits
                logprob[idx, : seq - 1] = stats[0]
                mean[idx, : seq - 1] = stats[1]
                std[idx, : seq - 1] = stats[2]
                bar.update(len(idx))
    finally:
        if was_training:
            model.train()
    return TokenSignals(logprob=logprob, mask=mask, mean=mean, std=std)


def compute_signals(
    model,
    tokenizer,
    texts: Sequence[str],
    *,
    batch_size: int = 16,
    max_length: int = 512,
    device: str | torch.device = "auto",
    progress: bool = True,
) -> TokenSignals:
    """Per-token log-probabilities of ``texts`` under a causal LM (batched).

    Texts are tokenised with the tokenizer's defaults, truncated to ``max_length`` tokens
    (and to the model's ``max_position_embeddings``), sorted by length to minimise
    padding, right-padded with an attention mask, and run under ``torch.inference_mode()``
    (bf16 autocast on CUDA, the output layer in float32 for the families that allow it: see
    :func:`_float32_head`); the output rows follow the order of ``texts``. Each logit
    goes through one exponential (float32, in cache-sized slices on CPU), from
    which the shifted-label log-prob and the mean/std used by Min-K%++ all follow.

    Args:
        model: a Hugging Face causal LM (anything returning ``.logits`` [B, L, V]). It is
            put in eval mode for the call (its mode is restored) and moved to ``device``.
        tokenizer: the matching Hugging Face tokenizer.
        texts: the texts.
        batch_size: texts per forward pass.
        max_length: longest token sequence kept per text.
        device: "auto" (CUDA if available, else CPU), "cpu", "cuda", "cuda:N" or a
            ``torch.device``.
        progress: show a tqdm progress bar on stderr.
    """
    texts = check_texts(texts)
    check_sizes(batch_size, max_length)
    dev = resolve_device(device)
    ids = _encode(tokenizer, texts, _model_max_length(model, max_length))
    return _signals_from_ids(
        model, ids, batch_size=batch_size, device=dev, progress=progress, desc="signals"
    )


def compute_signals_many(
    models: Iterable,
    tokenizer,
    texts: Sequence[str],
    *,
    batch_size: int = 16,
    max_length: int = 512,
    device: str | torch.device = "auto",
    progress: bool = True,
) -> list[TokenSignals]:
    """:func:`compute_signals` of the same texts under several models sharing a tokenizer.

    Texts are tokenised once. ``models`` may be a generator that loads each model on
    demand, so that only one model is in memory at a time.
    """
    texts = check_texts(texts)
    check_sizes(batch_size, max_length)
    dev = resolve_device(device)
    encoded: dict[int, list[list[int]]] = {}
    out = []
    for j, model in enumerate(models):
        limit = _model_max_length(model, max_length)
        if limit not in encoded:
            encoded[limit] = _encode(tokenizer, texts, limit)
        out.append(
            _signals_from_ids(
                model,
                encoded[limit],
                batch_size=batch_size,
                device=dev,
                progress=progress,
                desc=f"signals[{j}]",
            )
        )
    return out
