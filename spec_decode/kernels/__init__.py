"""CPU kernels for decoding: a small-K matmul called through XLA's FFI.

See `ops` for the API (`pack`, `matmul`, `available`) and `smallm.cc` for the
kernel.
"""
