// Fused scaled dot-product attention for XLA's CPU backend, through the typed FFI.
//
// Layout (the one kaun_ir's dot_product_attention works in, so no transposes are needed):
//   q [B, T, H, D], k [B, S, H, D], v [B, S, H, E] (float32, row-major)
//   out [B, T, H, E], lse [B, H, T]: the log-sum-exp of every row of scaled logits
// Attributes: scale (f32), causal (i32: key j is masked for query i when j > i).
// The backward pass takes q, k, v, out, lse and the cotangents of out and lse, recomputes the
// probabilities from lse and returns dq, dk, dv.
// Work is split over the B * H heads; XLA's intra-op thread pool runs the pieces.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

struct Dims {
  int64_t b, t, s, h, d, e;
};

// Runs body(item) for item in [0, n) on the caller and on the pool's threads; returns when
// every item is done. Tasks that start late find no item left and return at once (the state is
// shared, so it outlives the call).
template <typename Body>
void parallel_for(ffi::ThreadPool& pool, int64_t n, const Body& body) {
  struct State {
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> done{0};
    std::mutex mu;
    std::condition_variable cv;
  };
  int64_t workers = std::min<int64_t>(pool.num_threads(), n - 1);
  if (workers <= 0) {
    for (int64_t i = 0; i < n; ++i) body(i);
    return;
  }
  auto state = std::make_shared<State>();
  auto run = [state, n, &body]() {
    int64_t finished = 0;
    for (int64_t i; (i = state->next.fetch_add(1)) < n;) {
      body(i);
      ++finished;
    }
    if (finished && state->done.fetch_add(finished) + finished == n) {
      std::lock_guard<std::mutex> lock(state->mu);
      state->cv.notify_all();
    }
  };
  // `body` is referenced by tasks only while items remain, i.e. before this call returns.
  for (int64_t w = 0; w < workers; ++w) pool.Schedule(decltype(run)(run));
  run();
  std::unique_lock<std::mutex> lock(state->mu);
  state->cv.wait(lock, [&] { return state->done.load() == n; });
}

// 16 floats: one AVX-512 register (two AVX ones), through GCC's vector extension.
typedef float v16 __attribute__((vector_size(64), aligned(64)));
constexpr int64_t kW = 16;  // lanes
constexpr int64_t kR = 8;   // query rows per tile

inline int64_t round_up(int64_t n) { return (n + kW - 1) / kW * kW; }
inline v16 load(const float* p) {
  v16 x;
  std::memcpy(&x, p, sizeof(x));
  return x;
}
inline void store(float* p, v16 x) { std::memcpy(p, &x, sizeof(x)); }
inline v16 splat(float a) { return v16{} + a; }
typedef int32_t i16v __attribute__((vector_size(64), aligned(64)));

// exp on 16 lanes, x clamped to [-87, 88] (about 1e-38 .. 1.6e38); rounding to the nearest
// integer by the 1.5 * 2^23 trick, so that everything stays in vector registers.
inline v16 vexp(v16 x) {
  x = x > -87.0f ? x : splat(-87.0f);
  x = x < 88.0f ? x : splat(88.0f);
  const v16 magic = splat(12582912.0f);
  const v16 n = (x * 1.44269504088896341f + magic) - magic;
  const v16 r = x - n * 0.693145751953125f - n * 1.42860682030941723e-6f;
  v16 p = splat(1.0f / 720.0f);
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const i16v bits = (__builtin_convertvector(n, i16v) + 127) << 23;
  v16 two_n;
  std::memcpy(&two_n, &bits, sizeof(two_n));
  return p * two_n;
}

struct Scratch {
  // one head, zero-padded to whole vectors: q [T, Dp], k [Sp, Dp], kt [Dp, Sp], v [Sp, Ep],
  // vt [Ep, Sp], g = dout [T, Ep]; p / ds: kR rows of Sp; dk [Sp, Dp], dv [Sp, Ep]
  std::vector<float> q, k, kt, v, vt, g, o, p, ds, dk, dv;
};

Scratch& scratch() {
  thread_local Scratch sc;
  return sc;
}

// Copies head h of batch b of x [B, N, H, C] into dst [N, Cp] (zero padding beyond C).
inline void gather(const float* x, int64_t heads, int64_t n, int64_t c, int64_t cp, int64_t b,
                   int64_t h, float* dst) {
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(dst + i * cp, x + ((b * n + i) * heads + h) * c, c * sizeof(float));
    for (int64_t x2 = c; x2 < cp; ++x2) dst[i * cp + x2] = 0.0f;
  }
}

// [n, cp] -> [cp, np] (zero padding beyond n)
inline void transpose(const float* src, int64_t n, int64_t np, int64_t cp, float* dst) {
  for (int64_t x = 0; x < cp; ++x) {
    for (int64_t i = 0; i < n; ++i) dst[x * np + i] = src[i * cp + x];
    for (int64_t i = n; i < np; ++i) dst[x * np + i] = 0.0f;
  }
}

// out[r, j] = scale * sum_x a[r, x] * bt[x, j] for r < rows, j < jn (jn a multiple of kW);
// two column vectors at a time, so eight independent accumulators hide the FMA latency.
inline void tile_dot(const float* __restrict a, int64_t rows, int64_t cp,
                     const float* __restrict bt, int64_t np, int64_t jn, float scale,
                     float* __restrict out) {
  for (int64_t j = 0; j < jn; j += 2 * kW) {
    const bool two = j + kW < jn;
    v16 acc0[kR] = {}, acc1[kR] = {};
    for (int64_t x = 0; x < cp; ++x) {
      const v16 b0 = load(bt + x * np + j);
      const v16 b1 = two ? load(bt + x * np + j + kW) : v16{};
      for (int64_t r = 0; r < kR; ++r) {
        const float ar = r < rows ? a[r * cp + x] : 0.0f;
        acc0[r] += ar * b0;
        acc1[r] += ar * b1;
      }
    }
    for (int64_t r = 0; r < rows; ++r) {
      store(out + r * np + j, acc0[r] * scale);
      if (two) store(out + r * np + j + kW, acc1[r] * scale);
    }
  }
}

// out[r, :] = sum_{j < jn[r]} w[r, j] * m[j, :] for r < rows (cp a multiple of kW); the weights
// beyond jn[r] are zero, so all rows run to the longest jn.
inline void tile_combine(const float* __restrict w, int64_t np, const int64_t* jn, int64_t rows,
                         const float* __restrict m, int64_t cp, float* __restrict out) {
  const int64_t jmax = jn[rows - 1];
  for (int64_t x = 0; x < cp; x += 2 * kW) {
    const bool two = x + kW < cp;
    v16 acc0[kR] = {}, acc1[kR] = {};
    for (int64_t j = 0; j < jmax; ++j) {
      const v16 m0 = load(m + j * cp + x);
      const v16 m1 = two ? load(m + j * cp + x + kW) : v16{};
      for (int64_t r = 0; r < kR; ++r) {
        const float wr = w[r * np + j];
        acc0[r] += wr * m0;
        acc1[r] += wr * m1;
      }
    }
    for (int64_t r = 0; r < rows; ++r) {
      store(out + r * cp + x, acc0[r]);
      if (two) store(out + r * cp + x + kW, acc1[r]);
    }
  }
}

inline float hmax(v16 x) {
  float m = x[0];
  for (int i = 1; i < kW; ++i) m = std::max(m, x[i]);
  return m;
}
inline float hsum(v16 x) {
  float s = 0.0f;
  for (int i = 0; i < kW; ++i) s += x[i];
  return s;
}

// Row softmax in place over j < jn (the rest of the padded row becomes 0); returns lse.
inline float softmax_row(float* s, int64_t jn, int64_t np) {
  const v16 lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  const v16 lowest = splat(-3.0e38f);
  v16 mv = lowest;
  for (int64_t j = 0; j < np; j += kW) {
    v16 x = load(s + j);
    x = (lane + float(j) < float(jn)) ? x : lowest;
    store(s + j, x);
    mv = mv > x ? mv : x;
  }
  const float m = hmax(mv);
  v16 lv = {};
  for (int64_t j = 0; j < np; j += kW) {
    v16 x = load(s + j) - m;
    v16 e = vexp(x);
    e = (lane + float(j) < float(jn)) ? e : v16{};
    store(s + j, e);
    lv += e;
  }
  const float l = hsum(lv);
  const float inv = 1.0f / l;
  for (int64_t j = 0; j < np; j += kW) store(s + j, load(s + j) * inv);
  return m + std::log(l);
}

void forward_head(const float* q, const float* k, const float* v, float* out, float* lse,
                  const Dims& dm, float scale, bool causal, int64_t item) {
  const int64_t b = item / dm.h, h = item % dm.h;
  const int64_t T = dm.t, S = dm.s, D = dm.d, E = dm.e;
  const int64_t Dp = round_up(D), Ep = round_up(E), Sp = round_up(S);
  Scratch& sc = scratch();
  sc.q.resize(T * Dp), sc.k.resize(Sp * Dp), sc.kt.resize(Dp * Sp), sc.v.resize(Sp * Ep);
  sc.p.resize(kR * Sp), sc.g.resize(kR * Ep);
  gather(q, dm.h, T, D, Dp, b, h, sc.q.data());
  gather(k, dm.h, S, D, Dp, b, h, sc.k.data());
  gather(v, dm.h, S, E, Ep, b, h, sc.v.data());
  transpose(sc.k.data(), S, Sp, Dp, sc.kt.data());
  float* p = sc.p.data();
  float* o = sc.g.data();
  for (int64_t i0 = 0; i0 < T; i0 += kR) {
    const int64_t rows = std::min(kR, T - i0);
    int64_t jn[kR];
    for (int64_t r = 0; r < rows; ++r) jn[r] = causal ? std::min(i0 + r + 1, S) : S;
    tile_dot(sc.q.data() + i0 * Dp, rows, Dp, sc.kt.data(), Sp, round_up(jn[rows - 1]), scale,
             p);
    for (int64_t r = 0; r < rows; ++r) lse[(b * dm.h + h) * T + i0 + r] = softmax_row(p + r * Sp, jn[r], round_up(jn[rows - 1]));
    for (int64_t r = rows; r < kR; ++r)  // tile_combine reads all kR rows
      for (int64_t j = 0; j < Sp; ++j) p[r * Sp + j] = 0.0f;
    tile_combine(p, Sp, jn, rows, sc.v.data(), Ep, o);
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(out + ((b * T + i0 + r) * dm.h + h) * E, o + r * Ep, E * sizeof(float));
  }
}

// acc[j, :] += sum_r w[r, j] a[r, :] for j < jn, r < rows (a: rows x cp, cp a multiple of kW)
inline void accumulate_rows(const float* __restrict w, const float*, int64_t np, int64_t jn,
                            int64_t rows, const float* __restrict a, int64_t cp,
                            float* __restrict acc) {
  for (int64_t x = 0; x < cp; x += kW) {
    v16 ar[kR] = {};
    for (int64_t r = 0; r < rows; ++r) ar[r] = load(a + r * cp + x);
    for (int64_t j = 0; j < jn; ++j) {
      // two partial sums, so that the FMAs of one j are not one chain of kR
      v16 t0 = load(acc + j * cp + x), t1 = {};
      for (int64_t r = 0; r < kR; r += 2) {  // rows beyond `rows`: zero
        t0 += w[r * np + j] * ar[r];
        t1 += w[(r + 1) * np + j] * ar[r + 1];
      }
      store(acc + j * cp + x, t0 + t1);
    }
  }
}

void backward_head(const float* q, const float* k, const float* v, const float* out,
                   const float* lse, const float* dout, const float* dlse, float* dq, float* dk, float* dv,
                   const Dims& dm, float scale, bool causal, int64_t item) {
  const int64_t b = item / dm.h, h = item % dm.h;
  const int64_t T = dm.t, S = dm.s, D = dm.d, E = dm.e;
  const int64_t Dp = round_up(D), Ep = round_up(E), Sp = round_up(S);
  Scratch& sc = scratch();
  sc.q.resize(T * Dp), sc.k.resize(Sp * Dp), sc.kt.resize(Dp * Sp), sc.v.resize(Sp * Ep);
  sc.vt.resize(Ep * Sp), sc.g.resize(T * Ep), sc.p.resize(kR * Sp), sc.ds.resize(kR * Sp + kR * Dp);
  sc.dk.assign(Sp * Dp, 0.0f), sc.dv.assign(Sp * Ep, 0.0f);
  gather(q, dm.h, T, D, Dp, b, h, sc.q.data());
  gather(k, dm.h, S, D, Dp, b, h, sc.k.data());
  gather(v, dm.h, S, E, Ep, b, h, sc.v.data());
  gather(dout, dm.h, T, E, Ep, b, h, sc.g.data());
  sc.o.resize(T * Ep);
  gather(out, dm.h, T, E, Ep, b, h, sc.o.data());
  transpose(sc.k.data(), S, Sp, Dp, sc.kt.data());
  transpose(sc.v.data(), S, Sp, Ep, sc.vt.data());
  float* p = sc.p.data();
  float* ds = sc.ds.data();
  float* dqt = ds + kR * Sp;
  const v16 lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  for (int64_t i0 = 0; i0 < T; i0 += kR) {
    const int64_t rows = std::min(kR, T - i0);
    int64_t jn[kR];
    for (int64_t r = 0; r < rows; ++r) jn[r] = causal ? std::min(i0 + r + 1, S) : S;
    const int64_t jmax = round_up(jn[rows - 1]);
    tile_dot(sc.q.data() + i0 * Dp, rows, Dp, sc.kt.data(), Sp, jmax, scale, p);
    tile_dot(sc.g.data() + i0 * Ep, rows, Ep, sc.vt.data(), Sp, jmax, 1.0f, ds);
    for (int64_t r = 0; r < rows; ++r) {
      const float* gr = sc.g.data() + (i0 + r) * Ep;
      const float* orow = sc.o.data() + (i0 + r) * Ep;
      const int64_t at = (b * dm.h + h) * T + i0 + r;
      v16 dv16 = {};
      for (int64_t x = 0; x < Ep; x += kW) dv16 += load(gr + x) * load(orow + x);
      const float delta = hsum(dv16) - dlse[at];
      const float li = lse[at];
      float* pr = p + r * Sp;
      float* dr = ds + r * Sp;
      for (int64_t j = 0; j < jmax; j += kW) {
        v16 x = load(pr + j) - li;
        v16 e = vexp(x);
        e = (lane + float(j) < float(jn[r])) ? e : v16{};
        store(pr + j, e);
        store(dr + j, e * (load(dr + j) - delta) * scale);
      }
    }
    for (int64_t r = rows; r < kR; ++r)  // accumulate_rows reads all kR rows
      for (int64_t j = 0; j < Sp; ++j) p[r * Sp + j] = ds[r * Sp + j] = 0.0f;
    tile_combine(ds, Sp, jn, rows, sc.k.data(), Dp, dqt);
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(dq + ((b * T + i0 + r) * dm.h + h) * D, dqt + r * Dp, D * sizeof(float));
    // dk[j] += sum_r ds[r, j] q[r]; dv[j] += sum_r p[r, j] g[r]
    accumulate_rows(ds, p, Sp, jn[rows - 1], rows, sc.q.data() + i0 * Dp, Dp, sc.dk.data());
    accumulate_rows(p, ds, Sp, jn[rows - 1], rows, sc.g.data() + i0 * Ep, Ep, sc.dv.data());
  }
  for (int64_t j = 0; j < S; ++j) {
    const int64_t row = (b * S + j) * dm.h + h;
    std::memcpy(dk + row * D, sc.dk.data() + j * Dp, D * sizeof(float));
    std::memcpy(dv + row * E, sc.dv.data() + j * Ep, E * sizeof(float));
  }
}

using F32 = ffi::Buffer<ffi::F32>;
using F32Out = ffi::ResultBuffer<ffi::F32>;

ffi::Error check(const Dims& dm) {
  if (dm.b < 0 || dm.t < 1 || dm.s < 1 || dm.h < 1 || dm.d < 1 || dm.e < 1)
    return ffi::Error::InvalidArgument("attention: empty or malformed operands");
  return ffi::Error::Success();
}

Dims dims_of(const F32& q, const F32& k, const F32& v) {
  auto qd = q.dimensions(), kd = k.dimensions(), vd = v.dimensions();
  if (qd.size() != 4 || kd.size() != 4 || vd.size() != 4) return Dims{-1, 0, 0, 0, 0, 0};
  Dims dm{qd[0], qd[1], kd[1], qd[2], qd[3], vd[3]};
  if (kd[0] != dm.b || vd[0] != dm.b || kd[2] != dm.h || vd[2] != dm.h || kd[3] != dm.d ||
      vd[1] != dm.s)
    dm.b = -1;
  return dm;
}

ffi::Error Forward(ffi::ThreadPool pool, F32 q, F32 k, F32 v, F32Out out, F32Out lse, float scale,
                   int32_t causal) {
  const Dims dm = dims_of(q, k, v);
  if (auto err = check(dm); err.failure()) return err;
  const float* qp = q.typed_data();
  const float* kp = k.typed_data();
  const float* vp = v.typed_data();
  float* op = out->typed_data();
  float* lp = lse->typed_data();
  parallel_for(pool, dm.b * dm.h, [&](int64_t item) {
    forward_head(qp, kp, vp, op, lp, dm, scale, causal != 0, item);
  });
  return ffi::Error::Success();
}

ffi::Error Backward(ffi::ThreadPool pool, F32 q, F32 k, F32 v, F32 out, F32 lse, F32 dout,
                    F32 dlse, F32Out dq, F32Out dk, F32Out dv, float scale, int32_t causal) {
  const Dims dm = dims_of(q, k, v);
  if (auto err = check(dm); err.failure()) return err;
  const float *qp = q.typed_data(), *kp = k.typed_data(), *vp = v.typed_data();
  const float *op = out.typed_data(), *lp = lse.typed_data(), *gp = dout.typed_data();
  const float* glp = dlse.typed_data();
  float *dqp = dq->typed_data(), *dkp = dk->typed_data(), *dvp = dv->typed_data();
  parallel_for(pool, dm.b * dm.h, [&](int64_t item) {
    backward_head(qp, kp, vp, op, lp, gp, glp, dqp, dkp, dvp, dm, scale, causal != 0, item);
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(kaun_ir_attention_forward, Forward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<F32>()
                                  .Arg<F32>()
                                  .Arg<F32>()
                                  .Ret<F32>()
                                  .Ret<F32>()
                                  .Attr<float>("scale")
                                  .Attr<int32_t>("causal"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(kaun_ir_attention_backward, Backward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<F32>()
                                  .Arg<F32>()
                                  .Arg<F32>()
                                  .Arg<F32>()
                                  .Arg<F32>()
                                  .Arg<F32>()
                                  .Arg<F32>()
                                  .Ret<F32>()
                                  .Ret<F32>()
                                  .Ret<F32>()
                                  .Attr<float>("scale")
                                  .Attr<int32_t>("causal"));
