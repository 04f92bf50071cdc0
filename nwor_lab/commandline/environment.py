"""What a command's settings become once parsed: the `LabConfig` (with the NWOR_LAB_* overrides),
the device and the backend, each refusal a `UsageError` naming the flag or variable.

Torch is imported only by the device and backend checks, after the command line parsed."""
from __future__ import annotations

from nwor_lab.commandline.errors import UsageError
from nwor_lab.config import LabConfig


def lab_config(**explicit) -> LabConfig:
    """`LabConfig(**explicit)` with the NWOR_LAB_* overrides; a bad variable is a UsageError naming it."""
    try:
        return LabConfig.from_env(LabConfig(**explicit))
    except ValueError as err:
        raise UsageError(str(err)) from None


def check_device_arg(flag: str, device):
    """`--device` as a torch.device that exists here (imports torch), else a UsageError."""
    from nwor_lab._checks import check_device
    try:
        return check_device(flag, device)
    except ValueError as err:
        raise UsageError(str(err)) from None


def check_backend_arg(cfg: LabConfig, device) -> None:
    """The configured backend can run on `device` (`--backend cuda` needs a CUDA device), else a UsageError."""
    from nwor_lab._checks import check_backend_device
    try:
        check_backend_device(cfg.backend, device)
    except ValueError as err:
        raise UsageError(str(err)) from None
