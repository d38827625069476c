// The backend registry: which backends this build has and how to make one.
#include "exec/backend/backend.hpp"

#include <algorithm>

#include <unistd.h>

#include <cstdlib>

#include "exec/backend/half.hpp"
namespace memwall::exec {

Result<std::unique_ptr<Backend>> create_cpu_backend(const BackendOptions& o);
#if MEMWALL_HAVE_CUDA
Result<std::unique_ptr<Backend>> create_cuda_backend(const BackendOptions& o);
std::string cuda_blas_error();
std::string cuda_devices();
#endif

std::string cuda_libraries_error() {
#if MEMWALL_HAVE_CUDA
  return cuda_blas_error();
#else
  return "";
#endif
}

std::string backends_report() {
  std::string out = "backends:";
  for (const std::string& b : compiled_backends()) out += " " + b;
#if MEMWALL_HAVE_CUDA
  const std::string blas = cuda_blas_error();
  out += "\ncuda: " + cuda_devices() + "; cuBLAS " + (blas.empty() ? std::string("loads") : blas);
#else
  out += " (built without the CUDA toolkit: no cuda backend)";
#endif
  return out;
}

const char* compute_type_name(ComputeType t) {
  switch (t) {
    case ComputeType::fp32: return "fp32";
    case ComputeType::fp16: return "fp16";
    case ComputeType::bf16: return "bf16";
  }
  return "?";
}

Result<ComputeType> parse_compute_type(const std::string& s) {
  if (s == "fp32") return ComputeType::fp32;
  if (s == "fp16") return ComputeType::fp16;
  if (s == "bf16") return ComputeType::bf16;
  return make_error("expected fp32, fp16 or bf16, got \"" + s + "\"");
}

std::size_t backend_reserved_bytes(const std::string& name, std::size_t capacity_bytes) {
  if (name != "cuda") return 0;
  return std::min(std::size_t(32) << 20, capacity_bytes / 16 / 256 * 256);
}

double host_sum_squares(const void* x, adam::DType t, std::size_t n) {
  // eight interleaved sums (element i into sum i % 8), added in order at the end: independent
  // chains the compiler vectorises, the same bits on every call
  double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (std::size_t j = 0; j < 8; ++j) {
      const double v = half::element_f32(x, t, long(i + j));
      lane[j] += v * v;
    }
  for (; i < n; ++i) {
    const double v = half::element_f32(x, t, long(i));
    lane[i % 8] += v * v;
  }
  double sum = 0;
  for (double l : lane) sum += l;
  return sum;
}

std::vector<std::string> compiled_backends() {
#if MEMWALL_HAVE_CUDA
  return {"cpu", "cuda"};
#else
  return {"cpu"};
#endif
}

Result<std::unique_ptr<Backend>> create_backend(const std::string& name, const BackendOptions& options) {
  if (name == "cpu") return create_cpu_backend(options);
#if MEMWALL_HAVE_CUDA
  if (name == "cuda") return create_cuda_backend(options);
#else
  if (name == "cuda") return make_error("this memwall was built without CUDA (no nvcc found at configure time)");
#endif
  return make_error("expected a backend: cpu or cuda, got \"" + name + "\"");
}

}  // namespace memwall::exec
