"""Model classes and what touches a library's internals, below every backend.

diffllama_v2.py   the DIFF V2 model classes (transformers layout), registered with the Auto classes
auto_classes.py   that registration, deferred until transformers' Auto model module is imported
convert.py        a plain state dict -> a loadable DiffLlama, DiffLlamaV2 or Llama folder
compat.py         every use of a transformers internal, adapted across the supported releases
"""
