"""Model classes and what touches a library's internals, below every backend.

diffllama_v2.py   the DIFF V2 model classes (transformers layout), registered with the Auto classes
motif.py          Motif-2.6B and Motif-2-12.7B (grouped differential attention) in their Hub layout, likewise
phi4flash.py      Phi-4-mini-flash (SambaY) in its Hub layout, likewise; its attention, cache and Mamba
                  blocks in phi4flash_attention.py, phi4flash_cache.py, phi4flash_mamba.py
auto_classes.py   that registration, deferred until transformers' Auto model module is imported
convert.py        a plain state dict -> a loadable DiffLlama, DiffLlamaV2 or Llama folder
compat.py         every use of a transformers internal, adapted across the supported releases
lmeval_compat.py  every use of an lm-eval internal (RULER's code, task and metric registries)
"""
