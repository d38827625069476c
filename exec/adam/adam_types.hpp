// The two small enums CPU Adam is parameterised by: element types and instruction sets.
// Deliberately includes nothing: the per-ISA kernel files (compiled with -mavx512f / -mavx2) include
// it, and any inline library code they pulled in could be linked into callers on older CPUs.
// Plain values; thread-safe.
#pragma once

namespace memwall::adam {

enum class DType { fp32, fp16, bf16 };     // fp16 = IEEE binary16, bf16 = bfloat16
enum class Isa { scalar, avx2, avx512 };   // avx2 means AVX2 + FMA + F16C; avx512 means F + BW + VL

}  // namespace memwall::adam
