// The backend registry: which backends this build has and how to make one.
#include "exec/backend/backend.hpp"

namespace memwall::exec {

Result<std::unique_ptr<Backend>> create_cpu_backend(const BackendOptions& o);
#if MEMWALL_HAVE_CUDA
Result<std::unique_ptr<Backend>> create_cuda_backend(const BackendOptions& o);
#endif

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
