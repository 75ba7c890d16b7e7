#ifndef LOHAN_DAEMON_OPTIM_KERNEL_GENERIC_INL_H_
#define LOHAN_DAEMON_OPTIM_KERNEL_GENERIC_INL_H_

// Internal to daemon/optim. The Adam and SGD chunk kernels written once over
// a vector "traits" type V; each kernels_<isa>.cc defines its V in an
// anonymous namespace and instantiates these templates, so every
// instantiation has internal linkage and is compiled for that file's ISA only.
// Include nothing here that defines non-template inline functions (they
// would be compiled with ISA flags and could be picked for baseline code).
//
// V provides: type F (a vector of kWidth floats); kSoftwarePrefetch
// (whether the main loop may prefetch: the distance is the args'
// prefetch_elements); Set(float); LoadF32,
// LoadBf16, LoadFp16 from a pointer; StoreF32, StoreBf16, StoreFp16;
// StreamAligned(p) (whether StreamBf16/StreamFp16 may store at p + i for
// every full-vector i), StreamBf16, StreamFp16 (non-temporal where the ISA
// has them), StreamFence() (orders those stores before later ones);
// Mul, Div, Add, Sqrt, Fma(a, b, c) = a*b+c with one rounding,
// Max(a, b) = a > b ? a : b; type Acc with AccZero(), AccSq(Acc&, F) adding
// double(x)^2 per lane, AccReduce(const Acc&) summing lanes in fixed order.

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "daemon/optim/kernel_table.h"

namespace lohan::optim_internal::generic {

template <class V, DType T>
inline typename V::F Load(const void* base, std::size_t i) {
  if constexpr (T == DType::kFloat32) {
    return V::LoadF32(static_cast<const float*>(base) + i);
  } else if constexpr (T == DType::kBFloat16) {
    return V::LoadBf16(static_cast<const uint16_t*>(base) + i);
  } else {
    return V::LoadFp16(static_cast<const uint16_t*>(base) + i);
  }
}

template <class V, DType T>
inline void Store(void* base, std::size_t i, typename V::F x) {
  if constexpr (T == DType::kFloat32) {
    V::StoreF32(static_cast<float*>(base) + i, x);
  } else if constexpr (T == DType::kBFloat16) {
    V::StoreBf16(static_cast<uint16_t*>(base) + i, x);
  } else {
    V::StoreFp16(static_cast<uint16_t*>(base) + i, x);
  }
}

// The 16-bit weight copy: write-only, so the main loop may use V's
// streaming (non-temporal) store and skip reading the lines first.
template <class V, DType T, bool kStream>
inline void StoreOut(void* base, std::size_t i, typename V::F x) {
  uint16_t* p = static_cast<uint16_t*>(base) + i;
  if constexpr (!kStream) {
    Store<V, T>(base, i, x);
  } else if constexpr (T == DType::kBFloat16) {
    V::StreamBf16(p, x);
  } else {
    V::StreamFp16(p, x);
  }
}

template <DType T>
inline constexpr std::size_t kSize = T == DType::kFloat32 ? 4 : 2;

// Software prefetch `ahead` elements past i in the main loop. Can help one
// core keep enough lines in flight on the 4 to 6 streams (how much, and at
// what distance, depends on the microarchitecture: see calibration.h); past
// the end of a buffer a prefetch is harmless (it never faults).
template <DType T>
inline void Prefetch(const void* base, std::size_t i, std::size_t ahead,
                     bool for_write) {
  // Integer arithmetic: the address may lie past the buffer's end.
  const auto* p = reinterpret_cast<const char*>(
      reinterpret_cast<uintptr_t>(base) + (i + ahead) * kSize<T>);
  if (for_write) {
    __builtin_prefetch(p, 1, 3);
  } else {
    __builtin_prefetch(p, 0, 3);
  }
}

// Output kind index (0 none, 1 bf16, 2 fp16) to the stored dtype.
template <int O>
inline constexpr DType kOutType = O == 1 ? DType::kBFloat16 : DType::kFloat16;

// Pointers a block works on; for the tail they point at padded scratch.
struct AdamPtrs {
  float* w;
  void* m;
  void* v;
  void* vmax;
  const void* g;
  void* out;
};

// kStream: store the 16-bit copy with non-temporal stores. kPrefetch:
// prefetch a.prefetch_elements ahead (a block of the main loop, never the
// padded tail).
template <class V, DType G, DType M, int O, bool kStream, bool kPrefetch>
inline void AdamBlock(const AdamChunkArgs& a, const AdamPtrs& p, std::size_t i,
                      typename V::Acc& acc) {
  using F = typename V::F;
  if constexpr (kPrefetch) {
    const std::size_t ahead = a.prefetch_elements;
    Prefetch<DType::kFloat32>(p.w, i, ahead, true);
    Prefetch<M>(p.m, i, ahead, true);
    Prefetch<M>(p.v, i, ahead, true);
    Prefetch<G>(p.g, i, ahead, false);
  }
  F g = V::Mul(Load<V, G>(p.g, i), V::Set(a.inv_scale));
  V::AccSq(acc, g);
  F w = V::Mul(V::LoadF32(p.w + i), V::Set(a.decay));
  if (a.use_l2) g = V::Fma(V::Set(a.l2), w, g);
  F m = V::Fma(V::Set(a.beta1), Load<V, M>(p.m, i),
               V::Mul(V::Set(a.one_minus_beta1), g));
  F v = V::Fma(V::Set(a.beta2), Load<V, M>(p.v, i),
               V::Mul(V::Mul(V::Set(a.one_minus_beta2), g), g));
  Store<V, M>(p.m, i, m);
  Store<V, M>(p.v, i, v);
  if (a.amsgrad) {
    v = V::Max(Load<V, M>(p.vmax, i), v);
    Store<V, M>(p.vmax, i, v);
  }
  const F denom = V::Add(V::Div(V::Sqrt(v), V::Set(a.bias_correction2_sqrt)),
                         V::Set(a.eps));
  w = V::Fma(V::Set(a.neg_step_size), V::Div(m, denom), w);
  V::StoreF32(p.w + i, w);
  if constexpr (O != 0) StoreOut<V, kOutType<O>, kStream>(p.out, i, w);
}

// The full vectors of the chunk; returns where the tail starts.
template <class V, DType G, DType M, int O, bool kStream, bool kPrefetch>
std::size_t AdamMain(const AdamChunkArgs& a, const AdamPtrs& p,
                     typename V::Acc& acc) {
  constexpr std::size_t kW = V::kWidth;
  std::size_t i = 0;
  for (; i + kW <= a.n; i += kW)
    AdamBlock<V, G, M, O, kStream, kPrefetch>(a, p, i, acc);
  if constexpr (kStream) V::StreamFence();
  return i;
}

template <class V, DType G, DType M, int O>
double AdamChunk(const AdamChunkArgs& a) {
  constexpr std::size_t kW = V::kWidth;
  typename V::Acc acc = V::AccZero();
  const AdamPtrs p{a.weight,         a.exp_avg, a.exp_avg_sq,
                   a.max_exp_avg_sq, a.grad,    a.out};
  const bool stream = O != 0 && a.stream_out && V::StreamAligned(a.out);
  const bool prefetch = V::kSoftwarePrefetch && a.prefetch_elements != 0;
  std::size_t i;
  if (stream) {
    i = prefetch ? AdamMain<V, G, M, O, true, true>(a, p, acc)
                 : AdamMain<V, G, M, O, true, false>(a, p, acc);
  } else {
    i = prefetch ? AdamMain<V, G, M, O, false, true>(a, p, acc)
                 : AdamMain<V, G, M, O, false, false>(a, p, acc);
  }
  const std::size_t rest = a.n - i;
  if (rest != 0) {
    // Padded scratch: zeros in the unused lanes compute harmless values that
    // are never copied back (and add 0 to the sum of squares).
    alignas(64) float w[kW] = {};
    alignas(64) unsigned char m[kW * 4] = {}, v[kW * 4] = {}, vmax[kW * 4] = {},
                                     g[kW * 4] = {}, out[kW * 4] = {};
    constexpr std::size_t kM = kSize<M>;
    std::memcpy(w, a.weight + i, rest * 4);
    std::memcpy(m, static_cast<const char*>(a.exp_avg) + i * kM, rest * kM);
    std::memcpy(v, static_cast<const char*>(a.exp_avg_sq) + i * kM, rest * kM);
    if (a.amsgrad) {
      std::memcpy(vmax, static_cast<const char*>(a.max_exp_avg_sq) + i * kM,
                  rest * kM);
    }
    std::memcpy(g, static_cast<const char*>(a.grad) + i * kSize<G>,
                rest * kSize<G>);
    AdamBlock<V, G, M, O, false, false>(a, AdamPtrs{w, m, v, vmax, g, out}, 0,
                                        acc);
    std::memcpy(a.weight + i, w, rest * 4);
    std::memcpy(static_cast<char*>(a.exp_avg) + i * kM, m, rest * kM);
    std::memcpy(static_cast<char*>(a.exp_avg_sq) + i * kM, v, rest * kM);
    if (a.amsgrad) {
      std::memcpy(static_cast<char*>(a.max_exp_avg_sq) + i * kM, vmax,
                  rest * kM);
    }
    if constexpr (O != 0) {
      std::memcpy(static_cast<char*>(a.out) + i * 2, out, rest * 2);
    }
  }
  return V::AccReduce(acc);
}

struct SgdPtrs {
  float* w;
  float* buf;
  const void* g;
  void* out;
};

template <class V, DType G, int O, bool kStream, bool kPrefetch>
inline void SgdBlock(const SgdChunkArgs& a, const SgdPtrs& p, std::size_t i,
                     typename V::Acc& acc) {
  using F = typename V::F;
  if constexpr (kPrefetch) {
    const std::size_t ahead = a.prefetch_elements;
    Prefetch<DType::kFloat32>(p.w, i, ahead, true);
    if (a.use_momentum) Prefetch<DType::kFloat32>(p.buf, i, ahead, true);
    Prefetch<G>(p.g, i, ahead, false);
  }
  F g = V::Mul(Load<V, G>(p.g, i), V::Set(a.inv_scale));
  V::AccSq(acc, g);
  F w = V::LoadF32(p.w + i);
  if (a.use_l2) g = V::Fma(V::Set(a.l2), w, g);
  if (a.use_momentum) {
    F buf = g;
    if (!a.first_step) {
      buf = V::Fma(V::Set(a.momentum), V::LoadF32(p.buf + i),
                   V::Mul(V::Set(a.one_minus_dampening), g));
    }
    V::StoreF32(p.buf + i, buf);
    g = a.nesterov ? V::Fma(V::Set(a.momentum), buf, g) : buf;
  }
  w = V::Fma(V::Set(a.neg_lr), g, w);
  V::StoreF32(p.w + i, w);
  if constexpr (O != 0) StoreOut<V, kOutType<O>, kStream>(p.out, i, w);
}

template <class V, DType G, int O, bool kStream, bool kPrefetch>
std::size_t SgdMain(const SgdChunkArgs& a, const SgdPtrs& p,
                    typename V::Acc& acc) {
  constexpr std::size_t kW = V::kWidth;
  std::size_t i = 0;
  for (; i + kW <= a.n; i += kW)
    SgdBlock<V, G, O, kStream, kPrefetch>(a, p, i, acc);
  if constexpr (kStream) V::StreamFence();
  return i;
}

template <class V, DType G, int O>
double SgdChunk(const SgdChunkArgs& a) {
  constexpr std::size_t kW = V::kWidth;
  typename V::Acc acc = V::AccZero();
  const SgdPtrs p{a.weight, a.momentum_buffer, a.grad, a.out};
  const bool stream = O != 0 && a.stream_out && V::StreamAligned(a.out);
  const bool prefetch = V::kSoftwarePrefetch && a.prefetch_elements != 0;
  std::size_t i;
  if (stream) {
    i = prefetch ? SgdMain<V, G, O, true, true>(a, p, acc)
                 : SgdMain<V, G, O, true, false>(a, p, acc);
  } else {
    i = prefetch ? SgdMain<V, G, O, false, true>(a, p, acc)
                 : SgdMain<V, G, O, false, false>(a, p, acc);
  }
  const std::size_t rest = a.n - i;
  if (rest != 0) {
    alignas(64) float w[kW] = {}, buf[kW] = {};
    alignas(64) unsigned char g[kW * 4] = {}, out[kW * 4] = {};
    std::memcpy(w, a.weight + i, rest * 4);
    if (a.use_momentum) std::memcpy(buf, a.momentum_buffer + i, rest * 4);
    std::memcpy(g, static_cast<const char*>(a.grad) + i * kSize<G>,
                rest * kSize<G>);
    SgdBlock<V, G, O, false, false>(a, SgdPtrs{w, buf, g, out}, 0, acc);
    std::memcpy(a.weight + i, w, rest * 4);
    if (a.use_momentum) std::memcpy(a.momentum_buffer + i, buf, rest * 4);
    if constexpr (O != 0) {
      std::memcpy(static_cast<char*>(a.out) + i * 2, out, rest * 2);
    }
  }
  return V::AccReduce(acc);
}

// The gradient part of AdamBlock/SgdBlock alone: the same lanes, the same
// zero-padded tail and the same reduction, so the sum is theirs bit for bit.
template <class V, DType G>
double SumSquaresChunk(const void* grad, std::size_t n, float inv_scale,
                       std::size_t prefetch_elements) {
  constexpr std::size_t kW = V::kWidth;
  typename V::Acc acc = V::AccZero();
  const typename V::F scale = V::Set(inv_scale);
  const bool prefetch = V::kSoftwarePrefetch && prefetch_elements != 0;
  std::size_t i = 0;
  for (; i + kW <= n; i += kW) {
    if (prefetch) Prefetch<G>(grad, i, prefetch_elements, false);
    V::AccSq(acc, V::Mul(Load<V, G>(grad, i), scale));
  }
  if (i < n) {
    alignas(64) unsigned char g[kW * 4] = {};
    std::memcpy(g, static_cast<const char*>(grad) + i * kSize<G>,
                (n - i) * kSize<G>);
    V::AccSq(acc, V::Mul(Load<V, G>(g, 0), scale));
  }
  return V::AccReduce(acc);
}

// Array conversions (used by tests and tools).
template <class V, DType T>
void ToHalf(const float* in, uint16_t* out, std::size_t n) {
  constexpr std::size_t kW = V::kWidth;
  std::size_t i = 0;
  for (; i + kW <= n; i += kW) Store<V, T>(out, i, V::LoadF32(in + i));
  if (i < n) {
    alignas(64) float x[kW] = {};
    alignas(64) uint16_t y[kW] = {};
    std::memcpy(x, in + i, (n - i) * 4);
    Store<V, T>(y, 0, V::LoadF32(x));
    std::memcpy(out + i, y, (n - i) * 2);
  }
}

template <class V, DType T>
void FromHalf(const uint16_t* in, float* out, std::size_t n) {
  constexpr std::size_t kW = V::kWidth;
  std::size_t i = 0;
  for (; i + kW <= n; i += kW) V::StoreF32(out + i, Load<V, T>(in, i));
  if (i < n) {
    alignas(64) uint16_t x[kW] = {};
    alignas(64) float y[kW] = {};
    std::memcpy(x, in + i, (n - i) * 2);
    V::StoreF32(y, Load<V, T>(x, 0));
    std::memcpy(out + i, y, (n - i) * 4);
  }
}

// The whole table for one V.
template <class V>
KernelTable MakeTable(const char* name) {
  constexpr DType kF32 = DType::kFloat32;
  constexpr DType kBf16 = DType::kBFloat16;
  constexpr DType kF16 = DType::kFloat16;
  return KernelTable{
      name,
      {
          {{&AdamChunk<V, kF32, kF32, 0>, &AdamChunk<V, kF32, kF32, 1>,
            &AdamChunk<V, kF32, kF32, 2>},
           {&AdamChunk<V, kF32, kBf16, 0>, &AdamChunk<V, kF32, kBf16, 1>,
            &AdamChunk<V, kF32, kBf16, 2>}},
          {{&AdamChunk<V, kBf16, kF32, 0>, &AdamChunk<V, kBf16, kF32, 1>,
            &AdamChunk<V, kBf16, kF32, 2>},
           {&AdamChunk<V, kBf16, kBf16, 0>, &AdamChunk<V, kBf16, kBf16, 1>,
            &AdamChunk<V, kBf16, kBf16, 2>}},
          {{&AdamChunk<V, kF16, kF32, 0>, &AdamChunk<V, kF16, kF32, 1>,
            &AdamChunk<V, kF16, kF32, 2>},
           {&AdamChunk<V, kF16, kBf16, 0>, &AdamChunk<V, kF16, kBf16, 1>,
            &AdamChunk<V, kF16, kBf16, 2>}},
      },
      {
          {&SgdChunk<V, kF32, 0>, &SgdChunk<V, kF32, 1>, &SgdChunk<V, kF32, 2>},
          {&SgdChunk<V, kBf16, 0>, &SgdChunk<V, kBf16, 1>,
           &SgdChunk<V, kBf16, 2>},
          {&SgdChunk<V, kF16, 0>, &SgdChunk<V, kF16, 1>, &SgdChunk<V, kF16, 2>},
      },
      {&SumSquaresChunk<V, kF32>, &SumSquaresChunk<V, kBf16>,
       &SumSquaresChunk<V, kF16>},
      &ToHalf<V, kBf16>,
      &ToHalf<V, kF16>,
      &FromHalf<V, kBf16>,
      &FromHalf<V, kF16>,
  };
}

}  // namespace lohan::optim_internal::generic

#endif  // LOHAN_DAEMON_OPTIM_KERNEL_GENERIC_INL_H_
