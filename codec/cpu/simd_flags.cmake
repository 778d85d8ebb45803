# The compiler options of the SIMD kernels' translation unit (kernels_avx2.cc: AVX2 and FMA), for
# every CMake project that compiles it (the main build and the clang fuzz build).
set(LONGHAUL_AVX2_KERNELS_OPTIONS "-mavx2;-mfma")
