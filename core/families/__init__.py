"""Model families as data. Each family module defines:

  MODEL_TYPES  config.json model_type values it reads
  read_config  config.json dict → ModelConfig
  FIELDS       config.json field → table.Field: implemented, refused (for which values, and why) or ignored (why
               no number changes); core.loading runs table.check_fields with it before read_config
  WEIGHTS      our parameter name → checkpoint names to try, in order. `{}` stands for the layer index;
               a tuple of names is concatenated along dim 0 (separate q, k, v → one fused matrix).
  PREFIXES     optional prefixes that checkpoints put before every name ("model.", "transformer.", …)
  IGNORE       regexes of checkpoint tensors that are known and not needed (buffers, tied copies, poolers)
  TRANSFORMS   regex over our names → function(tensor, config) applied to the loaded tensor (GPT-2's Conv1D
               transpose, per-head fused q/k/v rows reordered)
  TO_CHECKPOINT  optional: the inverse of TRANSFORMS, for saving in the checkpoint's own layout
  WITH_CHECKPOINT  optional: (config, the checkpoint's tensor names) → config, where the files settle what
               config.json leaves open
"""
from __future__ import annotations

from types import ModuleType

from ..config import ConfigError
from . import bert, bloom, gemma, gpt2, gpt_neox, llama, marian, opt, phi3, t5

FAMILIES: dict[str, ModuleType] = {t: module for module in (gpt2, llama, bert, marian, gpt_neox, bloom, t5, gemma, phi3, opt) for t in module.MODEL_TYPES}


def family_for(raw: dict, source: str = "config.json") -> ModuleType:
    model_type = raw.get("model_type")
    if model_type not in FAMILIES:
        raise ConfigError(f"{source}: unknown architecture model_type={model_type!r} "
                          f"(architectures={raw.get('architectures')}); supported model types: {', '.join(sorted(FAMILIES))}")
    return FAMILIES[model_type]
