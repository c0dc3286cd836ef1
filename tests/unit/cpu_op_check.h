// Shared checks for the CPU op tests (tests/unit/test_cpu_*.cpp).
//
// An op under test is a "case": a struct with
//   std::vector<size_t> input_sizes() const;                    // the differentiable inputs
//   template <class T> std::vector<T> forward(const Arrays<T>& in) const;
//   template <class T> void backward(const Arrays<T>& in, const std::vector<T>& dout, Arrays<T>& grads) const;
// where backward accumulates into grads like the ops do. Non-differentiable inputs (tokens, targets,
// shapes) are members of the case.
#pragma once
#include <gtest/gtest.h>

#include <cstddef>
#include <random>
#include <vector>

#include <zshard/dtype.h>

#include "tests/support/test_support.h"

namespace zshard::test {

template <class T>
using Arrays = std::vector<std::vector<T>>;

inline std::vector<double> random_vector(size_t n, std::mt19937& rng, double lo = -2.0, double hi = 2.0) {
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> x(n);
  for (double& e : x) e = dist(rng);
  return x;
}

template <class To, class From>
std::vector<To> convert(const std::vector<From>& x) {
  return std::vector<To>(x.begin(), x.end());
}

template <class To, class From>
Arrays<To> convert(const Arrays<From>& x) {
  Arrays<To> out;
  for (const auto& a : x) out.push_back(convert<To>(a));
  return out;
}

// acc += x, as a backward accumulates: for bf16 in fp32, rounded once.
template <class T>
void add_into(T& acc, T x) {
  acc += x;
}
inline void add_into(bf16& acc, bf16 x) { acc = bf16(float(acc) + float(x)); }

inline std::vector<float> widen(const std::vector<bf16>& x) {
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = float(x[i]);
  return out;
}

// The values bf16 can hold nearest to x.
inline std::vector<float> bf16_values(const std::vector<double>& x) {
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = float(bf16(float(x[i])));
  return out;
}

// A gradient array as an op takes it: null when empty, as a frozen parameter's (FrozenCase in op_cases.h).
template <class T>
T* grad_or_null(std::vector<T>& g) {
  return g.empty() ? nullptr : g.data();
}

template <class T>
Arrays<T> zeros_like(const Arrays<T>& x) {
  Arrays<T> out;
  for (const auto& a : x) out.emplace_back(a.size(), T(0));
  return out;
}

template <class Case>
Arrays<double> random_inputs(const Case& c, std::mt19937& rng) {
  Arrays<double> in;
  for (size_t n : c.input_sizes()) in.push_back(random_vector(n, rng));
  return in;
}

// Backward against central finite differences of L = sum(out * w) with random w, in double, so every
// output element contributes. Error measure: max_rel_diff, i.e. ||analytic - numeric||_inf /
// ||numeric||_inf per input array. Then checks accumulation: a second backward doubles the gradients.
template <class Case>
void expect_backward_matches_finite_differences(const Case& c, unsigned seed = 1) {
  constexpr double kStep = 1e-5, kTolerance = 1e-6;
  std::mt19937 rng(seed);
  Arrays<double> in = random_inputs(c, rng);
  const std::vector<double> w = random_vector(c.template forward<double>(in).size(), rng);
  const auto loss = [&] {
    const std::vector<double> out = c.template forward<double>(in);
    double l = 0;
    for (size_t i = 0; i < out.size(); ++i) l += out[i] * w[i];
    return l;
  };

  Arrays<double> grads = zeros_like(in);
  c.template backward<double>(in, w, grads);
  for (size_t a = 0; a < in.size(); ++a) {
    std::vector<double> numeric(in[a].size());
    for (size_t i = 0; i < in[a].size(); ++i) {
      const double x0 = in[a][i];
      in[a][i] = x0 + kStep;
      const double up = loss();
      in[a][i] = x0 - kStep;
      const double down = loss();
      in[a][i] = x0;
      numeric[i] = (up - down) / (2 * kStep);
    }
    EXPECT_LE(max_rel_diff(grads[a], numeric), kTolerance) << "gradient of input " << a;
  }

  Arrays<double> twice = grads;
  c.template backward<double>(in, w, twice);
  for (size_t a = 0; a < in.size(); ++a) {
    std::vector<double> doubled = grads[a];
    for (double& g : doubled) g *= 2;
    EXPECT_LE(max_rel_diff(twice[a], doubled), 1e-15) << "accumulation into input " << a;
  }
}

// The float instantiation against the double one on the same (double-rounded-to-float) inputs, forward
// output and every input gradient, by max_rel_diff.
template <class Case>
void expect_float_matches_double(const Case& c, double tolerance = 1e-5, unsigned seed = 2) {
  std::mt19937 rng(seed);
  const Arrays<double> in_d = convert<double>(convert<float>(random_inputs(c, rng)));
  const Arrays<float> in_f = convert<float>(in_d);

  const std::vector<double> out_d = c.template forward<double>(in_d);
  const std::vector<float> out_f = c.template forward<float>(in_f);
  EXPECT_LE(max_rel_diff(convert<double>(out_f), out_d), tolerance) << "forward output";

  const std::vector<double> dout_d = convert<double>(convert<float>(random_vector(out_d.size(), rng)));
  Arrays<double> grads_d = zeros_like(in_d);
  Arrays<float> grads_f = zeros_like(in_f);
  c.template backward<double>(in_d, dout_d, grads_d);
  c.template backward<float>(in_f, convert<float>(dout_d), grads_f);
  for (size_t a = 0; a < in_d.size(); ++a)
    EXPECT_LE(max_rel_diff(convert<double>(grads_f[a]), grads_d[a]), tolerance) << "gradient of input " << a;
}

// The bf16 instantiation against the float one on the same inputs, values bf16 holds, so that only the
// bf16 op's own roundings (of its outputs, and of what it stores between its steps) differ: the forward
// output, and every input gradient accumulated onto the same random starting values, by max_rel_diff.
template <class Case>
void expect_bf16_matches_float(const Case& c, double tolerance, unsigned seed = 3) {
  std::mt19937 rng(seed);
  Arrays<float> in_f;
  for (const std::vector<double>& a : random_inputs(c, rng)) in_f.push_back(bf16_values(a));
  const Arrays<bf16> in_b = convert<bf16>(in_f);
  const std::vector<float> out_f = c.template forward<float>(in_f);
  EXPECT_LE(max_rel_diff(widen(c.template forward<bf16>(in_b)), out_f), tolerance) << "bf16 forward output";

  const std::vector<float> dout_f = bf16_values(random_vector(out_f.size(), rng));
  Arrays<float> grads_f;
  for (size_t n : c.input_sizes()) grads_f.push_back(bf16_values(random_vector(n, rng)));
  Arrays<bf16> grads_b = convert<bf16>(grads_f);
  c.template backward<float>(in_f, dout_f, grads_f);
  c.template backward<bf16>(in_b, convert<bf16>(dout_f), grads_b);
  for (size_t a = 0; a < in_f.size(); ++a)
    EXPECT_LE(max_rel_diff(widen(grads_b[a]), grads_f[a]), tolerance) << "bf16 gradient of input " << a;
}

}  // namespace zshard::test
