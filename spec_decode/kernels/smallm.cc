// Small-K matmul y[K, N] = x[K, D] @ W[D, N] for CPU, called from XLA's FFI.
//
// Decoding scores 1..32 tokens at a time, so the product is bound by reading
// W, not by arithmetic. The kernel reads every weight exactly once per call
// (for K <= 16) and keeps all K partial sums in vector registers, so scoring
// K tokens costs about what scoring one does.
//
// Packed layouts (built once by ops.pack, never by this file):
//   f32:  [P, D, 16] float32, P = ceil(N / 16). Panel p holds columns
//         16p..16p+15 of W, row after row; columns past N are zero.
//   bf16: [Q, D, 32] bfloat16 (as uint16), Q = ceil(N / 32). Panel q holds
//         columns 32q..32q+31; within a row, element 2j is column 32q+j and
//         element 2j+1 is column 32q+16+j, so one 32-bit lane holds two
//         weights that become two float32 lanes with a shift and a mask.
// Both read one contiguous stream per panel, which the hardware prefetcher
// follows; a tile reads up to four panels side by side.
//
// The code uses GCC vector extensions rather than intrinsics: with AVX-512 a
// vector is one zmm register, with AVX2 two ymm registers, and without either
// the compiler emits SSE or scalar code. The tile sizes follow the register
// file of the ISA the file is compiled for (SMALLM_ISA below).

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include <sched.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define SMALLM_PAUSE() _mm_pause()
#else
#define SMALLM_PAUSE() std::this_thread::yield()
#endif

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

// The library builds with -fvisibility=hidden; only these symbols are public.
#define SMALLM_EXPORT __attribute__((visibility("default")))
extern "C" SMALLM_EXPORT XLA_FFI_Error* SmallmF32(XLA_FFI_CallFrame*);
extern "C" SMALLM_EXPORT XLA_FFI_Error* SmallmBf16(XLA_FFI_CallFrame*);

namespace {

#if defined(__AVX512F__)
constexpr const char* kIsa = "avx512";
constexpr int kVecRegs = 32;  // zmm registers, one per 16-float vector.
constexpr int kRegsPerVec = 1;
#elif defined(__AVX2__) && defined(__FMA__)
constexpr const char* kIsa = "avx2";
constexpr int kVecRegs = 16;  // A 16-float vector spans two ymm registers.
constexpr int kRegsPerVec = 2;
#else
constexpr const char* kIsa = "generic";
constexpr int kVecRegs = 16;
constexpr int kRegsPerVec = 4;
#endif

typedef float vf __attribute__((vector_size(64)));
typedef uint32_t vu __attribute__((vector_size(64)));
// Unaligned variants: XLA buffers are aligned, but a panel row offset of a
// sliced operand need not be.
typedef float vf_u __attribute__((vector_size(64), aligned(4)));
typedef uint32_t vu_u __attribute__((vector_size(64), aligned(4)));

constexpr int kLanes = 16;

// Software prefetch distance in panel rows (64 bytes each, so 4 KB ahead per
// stream); 0 disables. Helps at K >= 8, where compute delays the loads that
// would otherwise trigger the hardware prefetcher.
#ifndef SMALLM_PREFETCH_ROWS
#define SMALLM_PREFETCH_ROWS 64
#endif
constexpr int kPrefetchRows = SMALLM_PREFETCH_ROWS;

// Rows of x per pass. More rows per pass means fewer passes over W but more
// accumulators; 16 keeps one 16-float vector per row in registers.
constexpr int kMaxRowsF32 = kVecRegs / kRegsPerVec >= 32 ? 16 : 6;
// bf16 tiles hold two vectors per panel, so a pass has at most 14 rows
// (2 * 14 accumulators + 2 weight vectors <= 32 registers).
constexpr int kMaxRowsBf16 = kVecRegs / kRegsPerVec >= 32 ? 14 : 6;

// Number of 16-column vectors a tile of `rows` rows processes at once, so
// that accumulators plus weight vectors fit the register file.
constexpr int VecsPerTile(int rows) {
  int regs = kVecRegs / kRegsPerVec;
  int v = regs / (rows + 1);
  if (v > 4) v = 4;
  if (v < 1) v = 1;
  return v;
}

// s - 0 folds to s (s + 0 does not, because of -0): one vbroadcastss.
inline vf Broadcast(float s) { return s - vf{}; }

// Stores lanes [0, n) of `v` at `dst` (n <= 16); the tail of the last panel
// is padding and must not be written past the end of y.
inline void StorePartial(float* dst, vf v, int n) {
  if (n >= kLanes) {
    *reinterpret_cast<vf_u*>(dst) = v;
  } else {
    float tmp[kLanes];
    std::memcpy(tmp, &v, sizeof(tmp));
    std::memcpy(dst, tmp, sizeof(float) * n);
  }
}

inline vf LoadPartial(const float* src, int n) {
  if (n >= kLanes) return *reinterpret_cast<const vf_u*>(src);
  float tmp[kLanes] = {};
  std::memcpy(tmp, src, sizeof(float) * n);
  vf v;
  std::memcpy(&v, tmp, sizeof(v));
  return v;
}

// Terms of the inner dimension summed in order before they are added to y.
// One accumulator over all of D (4096 for T5-XXL) loses precision as D grows;
// blocks of 128 keep the float32 error below PyTorch's (issue 28). Blocks
// start at absolute multiples of kSumBlock, so a row's sum does not depend on
// the depth chunking, nor on how many rows are multiplied together.
constexpr int64_t kSumBlock = 128;

// Stores one block's sums at y (the first block of D) or adds them to y.
template <int KB, int V>
inline void AddBlock(vf (&acc)[KB][V], bool add, float* __restrict y,
                     int64_t ldy, int64_t ncol) {
#pragma GCC unroll 16
  for (int k = 0; k < KB; ++k) {
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      int n = static_cast<int>(std::min<int64_t>(ncol - v * kLanes, kLanes));
      if (n <= 0) continue;
      float* dst = y + k * ldy + v * kLanes;
      StorePartial(dst, add ? LoadPartial(dst, n) + acc[k][v] : acc[k][v], n);
    }
  }
}

// One tile, float32 weights: rows [0, KB) of the pass, V panels (16 columns
// each) starting at `w`, depth rows [d0, d0 + depth) of D.
//   xt:   [depth, KB] x transposed, so the KB broadcasts of one d are adjacent.
//   w:    first panel's row d0; panel v starts at w + v * panel_stride.
//   y:    output of row 0, column of panel 0; row k at y + k * ldy.
//   ncol: valid columns from y's first column (the last tile is ragged).
// d0 is a multiple of kSumBlock; rows past d0 = 0 add to what y holds.
template <int KB, int V>
void TileF32(const float* __restrict xt, const float* __restrict w,
             int64_t panel_stride, int64_t d0, int64_t depth,
             float* __restrict y, int64_t ldy, int64_t ncol) {
  for (int64_t b0 = 0; b0 < depth; b0 += kSumBlock) {
    const int64_t b1 = std::min(depth, b0 + kSumBlock);
    vf acc[KB][V];
#pragma GCC unroll 16
    for (int k = 0; k < KB; ++k) {
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[k][v] = vf{};
    }
    for (int64_t d = b0; d < b1; ++d) {
      vf wv[V];
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) {
        const float* row = w + v * panel_stride + d * kLanes;
        if (kPrefetchRows > 0) __builtin_prefetch(row + kPrefetchRows * kLanes);
        wv[v] = *reinterpret_cast<const vf_u*>(row);
      }
#pragma GCC unroll 16
      for (int k = 0; k < KB; ++k) {
        vf b = Broadcast(xt[d * KB + k]);
#pragma GCC unroll 4
        for (int v = 0; v < V; ++v) acc[k][v] += b * wv[v];
      }
    }
    AddBlock<KB, V>(acc, d0 + b0 > 0, y, ldy, ncol);
  }
}

// One tile, bf16 weights: Q panels of 32 columns, each giving two vectors.
template <int KB, int Q>
void TileBf16(const float* __restrict xt, const uint16_t* __restrict w,
              int64_t panel_stride, int64_t d0, int64_t depth,
              float* __restrict y, int64_t ldy, int64_t ncol) {
  constexpr int V = 2 * Q;
  const vu hi_mask = vu{} + 0xFFFF0000u;
  for (int64_t b0 = 0; b0 < depth; b0 += kSumBlock) {
    const int64_t b1 = std::min(depth, b0 + kSumBlock);
    vf acc[KB][V];
#pragma GCC unroll 16
    for (int k = 0; k < KB; ++k) {
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[k][v] = vf{};
    }
    for (int64_t d = b0; d < b1; ++d) {
      vf wv[V];
#pragma GCC unroll 2
      for (int q = 0; q < Q; ++q) {
        const uint16_t* row = w + q * panel_stride + d * 2 * kLanes;
        if (kPrefetchRows > 0) {
          __builtin_prefetch(row + kPrefetchRows * 2 * kLanes);
        }
        vu raw = *reinterpret_cast<const vu_u*>(row);
        // bf16 is the top half of a float32: shift the low element up, mask
        // the high one in place.
        wv[2 * q] = reinterpret_cast<vf>(raw << 16);
        wv[2 * q + 1] = reinterpret_cast<vf>(raw & hi_mask);
      }
#pragma GCC unroll 16
      for (int k = 0; k < KB; ++k) {
        vf b = Broadcast(xt[d * KB + k]);
#pragma GCC unroll 4
        for (int v = 0; v < V; ++v) acc[k][v] += b * wv[v];
      }
    }
    AddBlock<KB, V>(acc, d0 + b0 > 0, y, ldy, ncol);
  }
}

template <typename T>
using TileFn = void (*)(const float*, const T*, int64_t, int64_t, int64_t,
                        float*, int64_t, int64_t);

// Tables of tile functions indexed [KB][panels per tile], KB up to 16.
template <int KB, int... Vs>
constexpr auto RowF32(std::integer_sequence<int, Vs...>) {
  return std::array<TileFn<float>, sizeof...(Vs)>{&TileF32<KB, Vs + 1>...};
}
template <int... Ks>
constexpr auto TableF32(std::integer_sequence<int, Ks...>) {
  return std::array<std::array<TileFn<float>, 4>, sizeof...(Ks)>{
      RowF32<Ks + 1>(std::make_integer_sequence<int, 4>())...};
}
template <int KB, int... Qs>
constexpr auto RowBf16(std::integer_sequence<int, Qs...>) {
  return std::array<TileFn<uint16_t>, sizeof...(Qs)>{
      &TileBf16<KB, Qs + 1>...};
}
template <int... Ks>
constexpr auto TableBf16(std::integer_sequence<int, Ks...>) {
  return std::array<std::array<TileFn<uint16_t>, 2>, sizeof...(Ks)>{
      RowBf16<Ks + 1>(std::make_integer_sequence<int, 2>())...};
}

const auto kTilesF32 = TableF32(std::make_integer_sequence<int, 16>());
const auto kTilesBf16 = TableBf16(std::make_integer_sequence<int, 16>());

// ---------------------------------------------------------------------------
// Thread pool.
//
// XLA:CPU runs its own intra-op threads; this pool adds at most threads - 1
// workers (the calling thread takes a share), default one per core the
// process may run on. Work is split into items claimed from a shared counter,
// not statically: on a shared machine a worker may be descheduled, and then
// the caller simply does more items instead of waiting for it. Workers spin
// briefly after a job, since decode steps call the kernel back to back, then
// sleep, so they do not take cores from XLA between steps.

int EnvInt(const char* name, int fallback) {
  const char* s = std::getenv(name);
  if (s == nullptr || *s == '\0') return fallback;
  return std::atoi(s);
}

int DefaultThreads() {
  cpu_set_t set;
  int n = 0;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) n = CPU_COUNT(&set);
  if (n <= 0) n = static_cast<int>(std::thread::hardware_concurrency());
  return std::max(1, n);
}

class Pool {
 public:
  static Pool& Get() {
    static Pool* pool = new Pool(  // Leaked: workers outlive static dtors.
        std::max(1, EnvInt("SPEC_DECODE_KERNEL_THREADS", DefaultThreads())),
        std::max(0, EnvInt("SPEC_DECODE_KERNEL_SPIN_US", 200)));
    return *pool;
  }

  int threads() const { return threads_; }

  // Runs fn(i) for every i in [0, items), on the caller and up to
  // `helpers` workers. If another call holds the pool (XLA may run
  // independent ops concurrently), the caller does all items alone rather
  // than wait or oversubscribe.
  void Run(int64_t items, int helpers,
           const std::function<void(int64_t)>& fn) {
    std::unique_lock<std::mutex> busy(run_mu_, std::try_to_lock);
    helpers = std::min(helpers, threads_ - 1);
    if (items <= 1 || helpers <= 0 || !busy.owns_lock()) {
      for (int64_t i = 0; i < items; ++i) fn(i);
      return;
    }
    job_ = &fn;
    items_ = items;
    helpers_ = helpers;
    next_.store(0);
    joined_.store(0);
    {
      std::lock_guard<std::mutex> lock(mu_);
      generation_.fetch_add(1);
    }
    cv_.notify_all();
    Drain();
    // Close the job, then wait only for workers that joined before the
    // close; a late worker sees `closed_` and leaves without touching it.
    closed_.store(generation_.load());
    // A worker still inside an item may have been descheduled (the machine
    // is shared); after a short spin, yield so it can run on this core.
    for (int polls = 0; active_.load() != 0; ++polls) {
      if (polls < 4096) {
        SMALLM_PAUSE();
      } else {
        std::this_thread::yield();
      }
    }
  }

 private:
  Pool(int threads, int spin_us) : threads_(threads), spin_us_(spin_us) {
    for (int t = 1; t < threads_; ++t) {
      std::thread([this] { Work(); }).detach();
    }
  }

  void Drain() {
    for (int64_t i; (i = next_.fetch_add(1)) < items_;) (*job_)(i);
  }

  void Work() {
    uint64_t seen = 0;
    for (;;) {
      uint64_t gen = generation_.load();
      if (gen == seen) {
        auto until = std::chrono::steady_clock::now() +
                     std::chrono::microseconds(spin_us_);
        int polls = 0;
        while ((gen = generation_.load()) == seen) {
          SMALLM_PAUSE();
          if ((++polls & 255) == 0 &&
              std::chrono::steady_clock::now() > until) {
            break;
          }
        }
        if (gen == seen) {
          std::unique_lock<std::mutex> lock(mu_);
          cv_.wait(lock, [&] { return (gen = generation_.load()) != seen; });
        }
      }
      seen = gen;
      // All seq_cst: either the caller's wait sees this increment, or this
      // load sees the caller's close.
      active_.fetch_add(1);
      if (closed_.load() < gen && joined_.fetch_add(1) < helpers_) Drain();
      active_.fetch_sub(1);
    }
  }

  const int threads_;
  const int spin_us_;
  std::mutex run_mu_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<uint64_t> closed_{0};
  std::atomic<int> active_{0};
  std::atomic<int> joined_{0};
  std::atomic<int64_t> next_{0};
  const std::function<void(int64_t)>* job_ = nullptr;
  int64_t items_ = 0;
  int helpers_ = 0;
};

// Below this many weight bytes per thread, waking a worker costs more than
// it saves.
int64_t MinBytesPerThread() {
  static const int64_t v =
      static_cast<int64_t>(EnvInt("SPEC_DECODE_KERNEL_MIN_KB_PER_THREAD", 128))
      << 10;
  return v;
}

// ---------------------------------------------------------------------------
// Driver shared by both weight types.

struct Problem {
  const float* x;   // [K, D]
  const void* w;    // packed
  float* y;         // [K, N]
  int64_t k, d, n;
  int64_t panels;       // P (f32) or Q (bf16)
  int panel_cols;       // 16 or 32
  int elem_bytes;       // 4 or 2
  int max_rows;         // rows per pass
};

// Splits K rows into passes of at most max_rows, sizes as even as possible.
void Passes(int64_t k, int max_rows, std::vector<std::pair<int, int>>* out) {
  int64_t passes = (k + max_rows - 1) / max_rows;
  int64_t start = 0;
  for (int64_t p = 0; p < passes; ++p) {
    int64_t rows = (k - start) / (passes - p);
    if ((k - start) % (passes - p)) ++rows;
    out->push_back({static_cast<int>(start), static_cast<int>(rows)});
    start += rows;
  }
}

template <typename T>
void Compute(const Problem& pr) {
  if (pr.k == 0 || pr.n == 0) return;
  if (pr.d == 0) {
    std::fill(pr.y, pr.y + pr.k * pr.n, 0.0f);
    return;
  }
  std::vector<std::pair<int, int>> passes;
  Passes(pr.k, pr.max_rows, &passes);

  // x transposed per pass: pass p's block is [D, rows_p] at offset start*D.
  thread_local std::vector<float> xt_buf;
  xt_buf.resize(static_cast<size_t>(pr.k * pr.d));
  float* xt = xt_buf.data();
  for (const auto& [start, rows] : passes) {
    float* blk = xt + start * pr.d;
    for (int r = 0; r < rows; ++r) {
      const float* xr = pr.x + (start + r) * pr.d;
      for (int64_t dd = 0; dd < pr.d; ++dd) blk[dd * rows + r] = xr[dd];
    }
  }

  constexpr bool kBf16 = sizeof(T) == 2;
  const int64_t panel_stride = pr.d * pr.panel_cols;  // elements
  const int64_t panel_bytes = panel_stride * pr.elem_bytes;
  Pool& pool = Pool::Get();
  const int threads = pool.threads();

  // Items are runs of adjacent panels, claimed dynamically by the threads.
  // 192 columns (a multiple of every tile width) unless that leaves fewer
  // than four items per thread.
  const int64_t full = 192 / pr.panel_cols;
  int64_t item_panels = full;
  if (pr.panels < full * 4 * threads) {
    item_panels = std::max<int64_t>(1, pr.panels / (4 * threads));
  }
  const int64_t items = (pr.panels + item_panels - 1) / item_panels;
  // With several passes, each pass re-reads the item's weights; chunking
  // the depth keeps one chunk (<= 512 KB) in L2 for all passes.
  int64_t depth_chunk = pr.d;
  if (passes.size() > 1) {
    int64_t row_bytes = item_panels * pr.panel_cols * pr.elem_bytes;
    // A multiple of kSumBlock, so the sum blocks do not depend on it.
    depth_chunk = std::max<int64_t>(
        kSumBlock, (512 << 10) / row_bytes / kSumBlock * kSumBlock);
  }

  const T* w = static_cast<const T*>(pr.w);
  auto work = [&](int64_t item) {
    const int64_t p0 = item * item_panels;
    const int64_t p1 = std::min(pr.panels, p0 + item_panels);
    for (int64_t d0 = 0; d0 < pr.d; d0 += depth_chunk) {
      const int64_t dl = std::min(depth_chunk, pr.d - d0);
      for (const auto& [start, rows] : passes) {
        const int per_tile = kBf16 ? std::max(1, VecsPerTile(rows) / 2)
                                   : VecsPerTile(rows);
        const float* xblk = xt + start * pr.d + d0 * rows;
        float* yrow = pr.y + start * pr.n;
        for (int64_t p = p0; p < p1; p += per_tile) {
          const int np = static_cast<int>(std::min<int64_t>(per_tile, p1 - p));
          const int64_t col = p * pr.panel_cols;
          const T* wp = w + p * panel_stride + d0 * pr.panel_cols;
          if constexpr (kBf16) {
            kTilesBf16[rows - 1][np - 1](xblk, wp, panel_stride, d0, dl,
                                         yrow + col, pr.n, pr.n - col);
          } else {
            kTilesF32[rows - 1][np - 1](xblk, wp, panel_stride, d0, dl,
                                        yrow + col, pr.n, pr.n - col);
          }
        }
      }
    }
  };
  const int64_t helpers = pr.panels * panel_bytes / MinBytesPerThread() - 1;
  pool.Run(items, static_cast<int>(std::min<int64_t>(helpers, threads - 1)),
           work);
}

// Collapses all leading dimensions of x into K. The packed weights may carry
// leading size-1 dimensions (vmap with expand_dims adds one).
ffi::Error Shapes(ffi::AnyBuffer::Dimensions xd, ffi::AnyBuffer::Dimensions wd,
                  ffi::AnyBuffer::Dimensions yd, int panel_cols, int64_t* k,
                  int64_t* d, int64_t* panels, int64_t* n) {
  if (xd.size() < 1 || wd.size() < 3 || yd.size() < 1) {
    return ffi::Error::InvalidArgument("smallm: bad operand ranks");
  }
  *d = xd.back();
  *k = 1;
  for (size_t i = 0; i + 1 < xd.size(); ++i) *k *= xd[i];
  for (size_t i = 0; i + 3 < wd.size(); ++i) {
    if (wd[i] != 1) {
      return ffi::Error::InvalidArgument(
          "smallm: batched packed weights are not supported");
    }
  }
  *panels = wd[wd.size() - 3];
  *n = yd.back();
  int64_t yk = 1;
  for (size_t i = 0; i + 1 < yd.size(); ++i) yk *= yd[i];
  if (wd[wd.size() - 2] != *d || wd.back() != panel_cols || yk != *k ||
      *n > *panels * panel_cols || *n <= (*panels - 1) * panel_cols) {
    return ffi::Error::InvalidArgument("smallm: operand shapes disagree");
  }
  return ffi::Error::Success();
}

ffi::Error SmallmF32Impl(ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w,
                         ffi::ResultBuffer<ffi::F32> y) {
  Problem pr{};
  if (auto e = Shapes(x.dimensions(), w.dimensions(), y->dimensions(), 16,
                      &pr.k, &pr.d, &pr.panels, &pr.n);
      e.failure()) {
    return e;
  }
  pr.x = x.typed_data();
  pr.w = w.typed_data();
  pr.y = y->typed_data();
  pr.panel_cols = 16;
  pr.elem_bytes = 4;
  pr.max_rows = kMaxRowsF32;
  Compute<float>(pr);
  return ffi::Error::Success();
}

ffi::Error SmallmBf16Impl(ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::BF16> w,
                          ffi::ResultBuffer<ffi::F32> y) {
  Problem pr{};
  if (auto e = Shapes(x.dimensions(), w.dimensions(), y->dimensions(), 32,
                      &pr.k, &pr.d, &pr.panels, &pr.n);
      e.failure()) {
    return e;
  }
  pr.x = x.typed_data();
  pr.w = w.typed_data();
  pr.y = y->typed_data();
  pr.panel_cols = 32;
  pr.elem_bytes = 2;
  pr.max_rows = kMaxRowsBf16;
  Compute<uint16_t>(pr);
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(SmallmF32, SmallmF32Impl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(SmallmBf16, SmallmBf16Impl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::BF16>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

// Plain C entry points for ctypes: which ISA the library was built for, its
// thread count, and a direct call used by the benchmark's memcpy baseline.
extern "C" {

SMALLM_EXPORT const char* smallm_isa() { return kIsa; }

SMALLM_EXPORT int smallm_threads() { return Pool::Get().threads(); }

// Copies `bytes` from src to dst split across the pool, `reps` times; the
// benchmark's bandwidth reference uses the same threads as the kernel.
SMALLM_EXPORT void smallm_parallel_copy(void* dst, const void* src,
                                        int64_t bytes, int reps) {
  Pool& pool = Pool::Get();
  const int64_t chunk = 1 << 20;  // Items of 1 MB, claimed like the kernel's.
  const int64_t items = (bytes + chunk - 1) / chunk;
  for (int r = 0; r < reps; ++r) {
    pool.Run(items, pool.threads() - 1, [&](int64_t i) {
      int64_t b0 = i * chunk;
      std::memcpy(static_cast<char*>(dst) + b0,
                  static_cast<const char*>(src) + b0,
                  std::min(chunk, bytes - b0));
    });
  }
}

// Reads `bytes` (a multiple of 64) split across the pool, `reps` times, and
// returns a sum so the reads are not optimized away: the ceiling for a
// kernel that only streams weights.
SMALLM_EXPORT float smallm_parallel_read(const void* src, int64_t bytes,
                                         int reps) {
  Pool& pool = Pool::Get();
  const int64_t chunk = 1 << 20;
  const int64_t items = (bytes + chunk - 1) / chunk;
  std::vector<float> sums(items);
  for (int r = 0; r < reps; ++r) {
    pool.Run(items, pool.threads() - 1, [&](int64_t i) {
      const float* p = static_cast<const float*>(src) + i * chunk / 4;
      int64_t vecs = std::min(chunk, bytes - i * chunk) / 64;
      vf a0{}, a1{}, a2{}, a3{};
      int64_t j = 0;
      for (; j + 4 <= vecs; j += 4) {
        a0 += *reinterpret_cast<const vf_u*>(p + 16 * j);
        a1 += *reinterpret_cast<const vf_u*>(p + 16 * j + 16);
        a2 += *reinterpret_cast<const vf_u*>(p + 16 * j + 32);
        a3 += *reinterpret_cast<const vf_u*>(p + 16 * j + 48);
      }
      for (; j < vecs; ++j) a0 += *reinterpret_cast<const vf_u*>(p + 16 * j);
      vf a = (a0 + a1) + (a2 + a3);
      float t = 0;
      for (int l = 0; l < kLanes; ++l) t += a[l];
      sums[i] = t;
    });
  }
  float total = 0;
  for (float v : sums) total += v;
  return total;
}

// Direct (non-XLA) call of the f32 kernel, for the benchmark.
SMALLM_EXPORT void smallm_f32(const float* x, const float* w, float* y,
                              int64_t k, int64_t d, int64_t n) {
  Problem pr{};
  pr.x = x;
  pr.w = w;
  pr.y = y;
  pr.k = k;
  pr.d = d;
  pr.n = n;
  pr.panels = (n + 15) / 16;
  pr.panel_cols = 16;
  pr.elem_bytes = 4;
  pr.max_rows = kMaxRowsF32;
  Compute<float>(pr);
}

}  // extern "C"
