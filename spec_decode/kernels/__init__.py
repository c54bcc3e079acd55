"""CPU kernels for decoding: a small-K matmul called through XLA's FFI.

On the CPU backend `Model` packs its decoder weights for it when
`config.cpu_kernel` is on and the library is available
(`SPEC_DECODE_KERNEL=0` turns it off).

  ops.py     the API: `pack`, `matmul` (inside jit), `available`
  build.py   builds `smallm.cc` with g++ (`spec-decode build-kernel`)
  smallm.cc  the kernel (C++): W read once for all K rows, packed once
"""
