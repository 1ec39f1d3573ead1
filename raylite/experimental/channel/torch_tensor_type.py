"""``TorchTensorType``, the type hint of a compiled-graph node that returns a torch tensor
(``node.with_type_hint(TorchTensorType(transport="accelerator"))``). Its arguments are checked as
Ray checks them; on one node every tensor travels through shared memory whatever they say."""
from __future__ import annotations


class TorchTensorType:
    AUTO = "auto"
    CPU = "cpu"
    ACCELERATOR = "accelerator"

    def __init__(self, transport: str = AUTO, device: str = "default", _static_shape: bool = False,
                 _direct_return: bool = False):
        if transport not in (self.AUTO, self.CPU, self.ACCELERATOR):
            raise ValueError(f"`transport` must be TorchTensorType.AUTO, TorchTensorType.ACCELERATOR or "
                             f"TorchTensorType.CPU, got transport={transport!r}")
        if str(device).lower() == "cpu" and transport == self.ACCELERATOR:
            raise ValueError("accelerator transport is not supported with the CPU device")
        self.transport, self.device = transport, device
        self._static_shape, self._direct_return = _static_shape, _direct_return

    def __repr__(self) -> str:
        return f"TorchTensorType(transport={self.transport!r}, device={self.device!r})"
