"""Which model definition runs a checkpoint.

The architecture comes from GGUF ``general.architecture`` or from HF ``config.json``
``architectures`` (falling back to ``model_type``); every name maps to one definition class.
An architecture with no definition is an ``UnsupportedArchitectureError`` that lists what is
supported, never a guess.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from poot.errors import UnsupportedArchitectureError
from poot.models.gemma import GemmaModel
from poot.models.llama import LlamaModel
from poot.models.moe import MixtralModel, OlmoeModel, Qwen2MoeModel, Qwen3MoeModel
from poot.models.phi3 import Phi3Model
from poot.models.qwen3 import Qwen3Model

if TYPE_CHECKING:
    from poot.checkpoints import ModelFiles

__all__ = [
    "FAMILIES",
    "GGUF_ARCHITECTURES",
    "HF_ARCHITECTURES",
    "architecture_of",
    "family_of",
    "model_definition",
]

# GGUF general.architecture -> definition.
GGUF_ARCHITECTURES: dict[str, type[LlamaModel]] = {
    "llama": LlamaModel,
    "mistral": LlamaModel,
    "qwen2": LlamaModel,
    "qwen3": Qwen3Model,
    "gemma2": GemmaModel,
    "gemma3": GemmaModel,
    "phi3": Phi3Model,
    "qwen2moe": Qwen2MoeModel,
    "qwen3moe": Qwen3MoeModel,
    "olmoe": OlmoeModel,
}

# GGUF architectures whose files with ``{arch}.expert_count`` are mixture-of-experts models.
GGUF_MOE: dict[str, type[LlamaModel]] = {"llama": MixtralModel, "mistral": MixtralModel}

# HF config.json architectures[0] (or model_type) -> definition.
HF_ARCHITECTURES: dict[str, type[LlamaModel]] = {
    "LlamaForCausalLM": LlamaModel,
    "MistralForCausalLM": LlamaModel,
    "Qwen2ForCausalLM": LlamaModel,
    "Qwen3ForCausalLM": Qwen3Model,
    "Gemma2ForCausalLM": GemmaModel,
    "Gemma3ForCausalLM": GemmaModel,
    "Phi3ForCausalLM": Phi3Model,
    "Qwen2MoeForCausalLM": Qwen2MoeModel,
    "Qwen3MoeForCausalLM": Qwen3MoeModel,
    "MixtralForCausalLM": MixtralModel,
    "OlmoeForCausalLM": OlmoeModel,
    "llama": LlamaModel,
    "mistral": LlamaModel,
    "qwen2": LlamaModel,
    "qwen3": Qwen3Model,
    "gemma2": GemmaModel,
    "gemma3_text": GemmaModel,
    "phi3": Phi3Model,
    "qwen2_moe": Qwen2MoeModel,
    "qwen3_moe": Qwen3MoeModel,
    "mixtral": MixtralModel,
    "olmoe": OlmoeModel,
}


def architecture_of(files: ModelFiles) -> str:
    """The architecture name the checkpoint states (GGUF or HF spelling)."""
    if files.kind == "gguf":
        arch = files.metadata.get("general.architecture")
        return arch if isinstance(arch, str) else ""
    archs = files.config.get("architectures")
    if isinstance(archs, list) and archs and isinstance(archs[0], str):
        return archs[0]
    model_type = files.config.get("model_type")
    return model_type if isinstance(model_type, str) else ""


# Definition -> the family name ``poot inspect`` shows.
FAMILIES: dict[type[LlamaModel], str] = {
    LlamaModel: "llama",
    Qwen3Model: "qwen3",
    GemmaModel: "gemma",
    Phi3Model: "phi3",
    MixtralModel: "mixtral",
    Qwen2MoeModel: "qwen2moe",
    Qwen3MoeModel: "qwen3moe",
    OlmoeModel: "olmoe",
}


def family_of(files: ModelFiles) -> str | None:
    """The model family poot runs the checkpoint as (e.g. ``"llama"``, ``"gemma"``), or None
    when its architecture has no definition."""
    cls = _definition_class(files)
    return FAMILIES[cls] if cls is not None else None


def _definition_class(files: ModelFiles) -> type[LlamaModel] | None:
    arch = architecture_of(files)
    if files.kind == "gguf":
        if arch in GGUF_MOE and files.hparams.n_experts > 0:
            return GGUF_MOE[arch]
        return GGUF_ARCHITECTURES.get(arch)
    return HF_ARCHITECTURES.get(arch)


def model_definition(files: ModelFiles) -> LlamaModel:
    """The model definition for a resolved checkpoint.

    Raises:
        UnsupportedArchitectureError: the architecture has no definition in poot.
    """
    arch = architecture_of(files)
    table = GGUF_ARCHITECTURES if files.kind == "gguf" else HF_ARCHITECTURES
    cls = _definition_class(files)
    if cls is None:
        supported = tuple(sorted(k for k in table if k[:1].isupper() or files.kind == "gguf"))
        where = "general.architecture" if files.kind == "gguf" else "config.json architectures"
        raise UnsupportedArchitectureError(
            f"{files.path}: {where} {arch!r} is not supported; poot runs " + ", ".join(supported),
            architecture=arch,
            supported=supported,
        )
    return cls.from_files(files)
