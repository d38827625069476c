// The portable Adam kernel: plain C++ one element at a time, for CPUs without AVX2 and as the
// reference the vector kernels must agree with bit for bit. Stateless; thread-safe.
#include "exec/adam/adam_kernels.hpp"

namespace memwall::adam::detail {
namespace {

void adam_scalar(const KernelArgs& a) { adam_scalar_range(a, 0, a.n); }

void convert_scalar(const float* src, void* dst, DType t, std::size_t n) { convert_scalar_range(src, dst, t, 0, n); }

}  // namespace

KernelTable scalar_kernels() { return {Isa::scalar, adam_scalar, convert_scalar}; }

}  // namespace memwall::adam::detail
