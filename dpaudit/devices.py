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
