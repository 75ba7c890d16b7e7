#ifndef LOHAN_DAEMON_OPTIM_KERNEL_TABLE_H_
#define LOHAN_DAEMON_OPTIM_KERNEL_TABLE_H_

// Internal to daemon/optim: the per-ISA elementwise kernels behind
// AdamUpdater and SgdUpdater. A kernel updates one contiguous chunk; the
// updaters split tensors into chunks and validate every argument first, so
// kernels trust their input.
//
// All paths do the same float operations in the same order (fma where the
// formula has a multiply-add, IEEE sqrt and division), so weights, moments
// and 16-bit copies come out bit-identical on every ISA. Only the gradient's
// sum of squares differs in its last bits (lane order of the double adds).
//
// This header is included by the per-ISA files, which are compiled with
// -mavx2 / -mavx512*: it must stay free of headers with inline functions or
// static initializers (no Abseil, no iostream), or code built for a wider ISA
// could end up running on a CPU without it.

#include <cstddef>
#include <cstdint>

#include "layout/dtype.h"

namespace lohan::optim_internal {

// Elements one kernel call handles at most; a multiple of every vector
// width, so chunk boundaries stay 64-byte aligned when the base is.
inline constexpr std::size_t kChunkElements = 16384;

// Per-element formula (float, fp = fused multiply-add):
//   g = grad * inv_scale;  sum_sq += double(g) * double(g)
//   w = w * decay                          (AdamW: decay = 1 - lr*wd, else 1)
//   if use_l2: g = fma(l2, w, g)           (Adam with weight decay)
//   m = fma(beta1, m, one_minus_beta1 * g)
//   v = fma(beta2, v, (one_minus_beta2 * g) * g)
//   if amsgrad: vmax = max(vmax, v); v_used = vmax  else v_used = v
//   denom = sqrt(v_used) / bias_correction2_sqrt + eps
//   w = fma(neg_step_size, m / denom, w)
//   out = round16(w)                       (if out != null)
struct AdamChunkArgs {
  std::size_t n = 0;
  float* weight = nullptr;
  void* exp_avg = nullptr;         // moment dtype
  void* exp_avg_sq = nullptr;      // moment dtype
  void* max_exp_avg_sq = nullptr;  // moment dtype; used iff amsgrad
  const void* grad = nullptr;      // grad dtype
  void* out = nullptr;             // out dtype, or null
  float inv_scale = 1.0f;
  float beta1 = 0.0f;
  float one_minus_beta1 = 0.0f;
  float beta2 = 0.0f;
  float one_minus_beta2 = 0.0f;
  float decay = 1.0f;
  float l2 = 0.0f;
  float neg_step_size = 0.0f;
  float bias_correction2_sqrt = 1.0f;
  float eps = 0.0f;
  bool use_l2 = false;
  bool amsgrad = false;
  // Memory-movement choices (tuning.h); the results do not depend on them.
  std::size_t prefetch_elements = 0;  // 0: no software prefetch
  bool stream_out = false;            // non-temporal stores for `out`
};

// Per-element formula (torch.optim.SGD):
//   g = grad * inv_scale;  sum_sq += double(g) * double(g)
//   if use_l2: g = fma(l2, w, g)
//   if use_momentum:
//     buf = first_step ? g : fma(momentum, buf, one_minus_dampening * g)
//     g = nesterov ? fma(momentum, buf, g) : buf
//   w = fma(neg_lr, g, w);  out = round16(w)
struct SgdChunkArgs {
  std::size_t n = 0;
  float* weight = nullptr;
  float* momentum_buffer = nullptr;  // fp32; used iff use_momentum
  const void* grad = nullptr;
  void* out = nullptr;
  float inv_scale = 1.0f;
  float l2 = 0.0f;
  float momentum = 0.0f;
  float one_minus_dampening = 1.0f;
  float neg_lr = 0.0f;
  bool use_l2 = false;
  bool use_momentum = false;
  bool first_step = false;
  bool nesterov = false;
  std::size_t prefetch_elements = 0;  // as AdamChunkArgs
  bool stream_out = false;
};

// Returns the chunk's gradient sum of squares (inf/NaN if any element is).
using AdamChunkFn = double (*)(const AdamChunkArgs&);
using SgdChunkFn = double (*)(const SgdChunkArgs&);
// The gradient sum of squares alone, for n elements of one chunk:
//   g = grad * inv_scale;  sum_sq += double(g) * double(g)
// with the Adam and SGD kernels' vector lanes and reduction, so it returns
// bit for bit what they return for the same chunk.
using SumSquaresFn = double (*)(const void* grad, std::size_t n,
                                float inv_scale, std::size_t prefetch_elements);
using ToHalfFn = void (*)(const float* in, uint16_t* out, std::size_t n);
using FromHalfFn = void (*)(const uint16_t* in, float* out, std::size_t n);

// Output kinds index the tables: none, bf16, fp16.
inline constexpr int kNumOutKinds = 3;
inline constexpr int kNumGradTypes = 3;    // indexed by DType
inline constexpr int kNumMomentTypes = 2;  // fp32, bf16

struct KernelTable {
  const char* name;
  AdamChunkFn adam[kNumGradTypes][kNumMomentTypes][kNumOutKinds];
  SgdChunkFn sgd[kNumGradTypes][kNumOutKinds];
  SumSquaresFn sum_squares[kNumGradTypes];
  ToHalfFn float_to_bf16;
  ToHalfFn float_to_fp16;
  FromHalfFn bf16_to_float;
  FromHalfFn fp16_to_float;
};

// Per-ISA tables, each defined in its own translation unit compiled for that
// ISA. REQUIRES: the CPU supports the ISA before any function is called.
const KernelTable& ScalarKernels();
const KernelTable& Avx2Kernels();
const KernelTable& Avx512Kernels();      // integer bf16 rounding
const KernelTable& Avx512Bf16Kernels();  // VCVTNEPS2BF16

}  // namespace lohan::optim_internal

#endif  // LOHAN_DAEMON_OPTIM_KERNEL_TABLE_H_
