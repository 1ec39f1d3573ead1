"""``ray.experimental.channel``: the type hints compiled graphs take (``with_type_hint``)."""
from raylite.experimental.channel.torch_tensor_type import TorchTensorType

__all__ = ["TorchTensorType"]
