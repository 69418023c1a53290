"""Framework-neutral Triton kernels built on the device API: a persistent GEMM core
(`gemm`) and GEMM + communication fused kernels (`fused`)."""
