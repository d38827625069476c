// adam_ref_tool: runs memwall's CPU Adam on tensors in files, for torch_reference.py to compare
// with torch.optim.Adam/AdamW. Test-only; one invocation, one thread of control.
//   adam_ref_tool isas                       print the ISA paths this CPU runs, one per line
//   adam_ref_tool adam key=value... dir=D    D/{param,exp_avg,exp_avg_sq}.bin (fp32, n) and
//       D/grads.bin (steps x n of grad dtype) in; D/out_{param,exp_avg,exp_avg_sq}.bin and
//       D/out_param16.bin (uint16, after the last step) out
//   adam_ref_tool convert isa=I dtype=T n=N dir=D   D/src.bin (fp32) -> D/out_param16.bin
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "exec/adam/cpu_adam.hpp"

using namespace memwall::adam;

namespace {

[[noreturn]] void die(const std::string& msg) {
  std::cerr << "adam_ref_tool: " << msg << "\n";
  std::exit(1);
}

template <typename T>
T take(memwall::Result<T> r) {
  if (!r) die(r.error());
  return std::move(r).value();
}

std::vector<char> read_file(const std::string& path, std::size_t bytes) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> buf(bytes);
  if (!in.read(buf.data(), static_cast<std::streamsize>(bytes))) die(path + ": short read");
  return buf;
}

void write_file(const std::string& path, const void* data, std::size_t bytes) {
  std::ofstream out(path, std::ios::binary);
  if (!out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes))) die(path + ": write failed");
}

template <typename T>
std::vector<T> read_array(const std::string& path, std::size_t n) {
  std::vector<char> raw = read_file(path, n * sizeof(T));
  std::vector<T> out(n);
  std::copy(raw.begin(), raw.end(), reinterpret_cast<char*>(out.data()));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) die("usage: adam_ref_tool isas | adam key=value... | convert key=value...");
  const std::string mode = argv[1];
  if (mode == "isas") {
    for (Isa i : supported_isas()) std::cout << isa_name(i) << "\n";
    return 0;
  }
  std::map<std::string, std::string> kv;
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    auto eq = a.find('=');
    if (eq == std::string::npos) die("expected key=value, got " + a);
    kv[a.substr(0, eq)] = a.substr(eq + 1);
  }
  auto get = [&](const std::string& k) {
    auto it = kv.find(k);
    if (it == kv.end()) die("missing " + k);
    return it->second;
  };
  auto num = [&](const std::string& k) { return std::strtod(get(k).c_str(), nullptr); };
  const std::string dir = get("dir");
  const std::size_t n = std::stoull(get("n"));
  const Isa isa = take(parse_isa(get("isa")));

  if (mode == "convert") {
    const DType t = take(parse_dtype(get("dtype")));
    CpuAdam adam = take(CpuAdam::create(AdamOptions{}, 2, isa));
    std::vector<float> src = read_array<float>(dir + "/src.bin", n);
    std::vector<std::uint16_t> out(n, 0xDEAD);
    take(adam.convert(src.data(), out.data(), t, n));
    write_file(dir + "/out_param16.bin", out.data(), n * 2);
    return 0;
  }
  if (mode != "adam") die("unknown mode " + mode);

  AdamOptions o;
  o.lr = num("lr");
  o.beta1 = num("beta1");
  o.beta2 = num("beta2");
  o.eps = num("eps");
  o.weight_decay = num("weight_decay");
  o.decoupled_weight_decay = get("decoupled") == "1";
  // One clip coefficient per step (clip_grad_norm_ computes a new one every step).
  std::vector<double> clip_coefs;
  {
    std::string all = get("clip_coefs") + ",";
    for (std::size_t pos = 0, comma; (comma = all.find(',', pos)) != std::string::npos; pos = comma + 1)
      clip_coefs.push_back(std::strtod(all.substr(pos, comma - pos).c_str(), nullptr));
  }
  const int threads = std::stoi(get("threads"));
  const long first_step = std::stol(get("first_step"));
  const int steps = std::stoi(get("steps"));
  const DType grad_dtype = take(parse_dtype(get("grad")));
  const std::string copy = get("copy");

  CpuAdam adam = take(CpuAdam::create(o, threads, isa));
  std::vector<float> param = read_array<float>(dir + "/param.bin", n);
  std::vector<float> m = read_array<float>(dir + "/exp_avg.bin", n);
  std::vector<float> v = read_array<float>(dir + "/exp_avg_sq.bin", n);
  const std::size_t gbytes = dtype_bytes(grad_dtype);
  std::vector<char> grads = read_file(dir + "/grads.bin", static_cast<std::size_t>(steps) * n * gbytes);
  std::vector<std::uint16_t> p16(n, 0xDEAD);

  AdamChunk c;
  c.param = param.data();
  c.exp_avg = m.data();
  c.exp_avg_sq = v.data();
  c.grad_dtype = grad_dtype;
  c.param16 = copy == "none" ? nullptr : p16.data();
  if (copy != "none") c.param16_dtype = take(parse_dtype(copy));
  c.n = n;
  for (int s = 0; s < steps; ++s) {
    c.grad = grads.data() + static_cast<std::size_t>(s) * n * gbytes;
    if (static_cast<std::size_t>(s) >= clip_coefs.size()) die("clip_coefs: fewer values than steps");
    take(adam.step(c, first_step + s, GradScaling{num("loss_scale"), clip_coefs[static_cast<std::size_t>(s)]}));
  }
  write_file(dir + "/out_param.bin", param.data(), n * 4);
  write_file(dir + "/out_exp_avg.bin", m.data(), n * 4);
  write_file(dir + "/out_exp_avg_sq.bin", v.data(), n * 4);
  write_file(dir + "/out_param16.bin", p16.data(), n * 2);
  return 0;
}
