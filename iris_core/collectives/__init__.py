"""Whole-array collective kernels on the symmetric heap (device code, framework-neutral).

kernels.py is the kernel (`collective_kernel`); kinds.py names what a launch asks for (kind,
op, all-reduce algorithm) and algorithms.py what each algorithm runs; the other modules are its
parts (see the tree in docs/architecture.md). The package imports nothing itself, so that host
code can read kinds.py, algorithms.py and the layouts without building the kernels.
"""
