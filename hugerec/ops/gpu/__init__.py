"""Triton kernels of the embedding engine on CUDA: the mirror of `hugerec.ops.cpu`, module for module
(same file names, function names and argument order where the operation is the same), imported only on
the first CUDA call by `hugerec.ops` (the package imports without Triton). ARCHITECTURE.md, "GPUs"."""
