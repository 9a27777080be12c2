"""How a step runs fast, never what is trained: compiled generation, fused kernels, the CPU optimizer,
sharding, micro-batch sizing and the vLLM LoRA push. The layer below trainer/: nothing here imports it.
"""
