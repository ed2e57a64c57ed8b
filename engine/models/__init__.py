"""Model side of the engine: loading (transformers + gguf, conversion cache) and our Llama-family decoder."""

from engine.models.llama import Transformer
from engine.models.loader import LoadedModel, ModelLoadError, load_model

__all__ = ["LoadedModel", "ModelLoadError", "Transformer", "load_model"]
