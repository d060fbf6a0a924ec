"""Stand-in for ``comfy/model_base.py``: ``BaseModel`` is a plain torch module of N equal weight tensors.

Real diffusion models are big ``torch.nn.Module`` trees; the memory code only sees their tensors, so a flat
list of ``blocks.<i>.weight`` parameters of a chosen count and size is enough to exercise it.
"""
import torch


class _Block(torch.nn.Module):
    # Filled, not zeros: calloc'd zero pages would make the simulated copies unrealistically cheap.
    def __init__(self, numel, dtype):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.full((numel,), 0.5, dtype=dtype), requires_grad=False)


class BaseModel(torch.nn.Module):
    """A model of ``tensor_count`` weights of ``tensor_numel`` elements each (``nbytes`` = count*numel*itemsize)."""

    def __init__(self, tensor_count=8, tensor_numel=1024, dtype=torch.float32):
        super().__init__()
        self.dtype = dtype
        self.blocks = torch.nn.ModuleList(_Block(tensor_numel, dtype) for _ in range(tensor_count))

    def get_dtype(self):
        """The weight dtype; ModelPatcher.model_dtype() reports it like for real models."""
        return self.dtype
