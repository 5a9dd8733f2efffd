"""The one device resolution: ``"auto"``, ``"cpu"``, ``"cuda"`` or ``"cuda:N"`` to a ``torch.device``;
and where a model is placed on it."""

from __future__ import annotations

from dpaudit.errors import InputError


def resolve_device(device, *, what: str = "device"):
    """``device`` (a name or a ``torch.device``) as a ``torch.device``: ``"auto"`` is CUDA when
    it is available, else the CPU. ``what`` names the setting in the error messages."""
    import torch

    if isinstance(device, torch.device):
        resolved = device
    elif device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        try:
            resolved = torch.device(device)
        except (RuntimeError, TypeError):
            raise InputError(f"{what} must be auto, cpu, cuda or cuda:N, got {device!r}") from None
    if resolved.type not in ("cpu", "cuda"):
        raise InputError(f"{what} must be auto, cpu, cuda or cuda:N, got {device!r}")
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise InputError(f"{what} is {device} but CUDA is not available")
    return resolved


def place_model(model, device):
    """Move ``model`` to ``device`` unless it is dispatched over devices already.

    Returns the device its inputs must go to.
    """
    if getattr(model, "hf_device_map", None):
        # Spread over devices by accelerate: inputs go where the embeddings are.
        return model.get_input_embeddings().weight.device
    param = next(model.parameters(), None)
    if param is not None and param.device != device:
        model.to(device)
    return device


def to_device(tensor, device):
    """The host tensor ``tensor`` on ``device``, without waiting for the work queued there.

    On CUDA an ordinary copy from the host (``non_blocking=False``) synchronizes the stream:
    the host waits until the device has done everything queued before it. A copy in the middle
    of a training step (an index, a counter) would make the host wait for the step's own
    backward pass before it queues the rest. Here the copy goes through pinned memory with
    ``non_blocking=True``, which the stream orders after that work without the host waiting
    (torch keeps the pinned block until the copy is done); to another device, ``non_blocking``
    too. A tensor already off the host is moved as ``tensor.to(device)``.
    """
    import torch

    device = torch.device(device)
    if tensor.device.type != "cpu" or device.type == "cpu":
        return tensor.to(device)
    if device.type == "cuda":
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=True)
