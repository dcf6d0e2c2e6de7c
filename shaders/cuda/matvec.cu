// x [t, k] times W stored [n, k] -> y [t, n], the weight read packed in place.
//
// Launch: block (256), grid (ceil(n / 8), ceil(t / TOK)). Each warp owns one output row
// for up to TOK tokens (1 in `matvec_*`, MV_TOK in `matmul_*`): its lanes split the row (below, per format), decode each weight
// exactly once (the reference dequantizer's `q * d` / `q * d + m`, unfused) and
// accumulates w * x in f32 for each of its tokens, so a prompt reads each weight t / MV_TOK
// times rather than t times. The warp sums its lanes in a fixed xor tree. Each token's
// additions happen in the same order whatever the token count, so a row's result does not
// depend on the tokens beside it, and the order is the same on the GPU and the CPU shim (NVRTC
// runs with --fmad=false, the shim with -ffp-contract=off): both give the same bits.
// Requires k % 32 == 0 for the block formats (every block is whole by the format).
#include "common.cuh"

#define MV_ROWS 8
#define MV_TOK 4

// Each format's body is a template over TOK, the tokens a warp takes: `matvec_*` (TOK = 1, one
// token, no per-token predicate) and `matmul_*` (TOK = MV_TOK) instantiate it. A token's sums run
// in the same order in both, so the two give the same bits.
// The prologue every body shares: this warp's row, lane and token group, zeroed sums.
#define MV_BEGIN                                                                  \
    int row = blockIdx.x * MV_ROWS + (threadIdx.x >> 5);                          \
    int lane = threadIdx.x & 31;                                                  \
    int t0 = blockIdx.y * TOK;                                                    \
    int nt = TOK == 1 ? 1 : (t - t0 < TOK ? t - t0 : TOK);                        \
    float acc[TOK];                                                               \
    for (int u = 0; u < TOK; ++u) {                                               \
        acc[u] = 0.0f;                                                            \
    }                                                                             \
    const float* xt = x + (long long)t0 * (long long)k;

// acc[u] += wv * x[t0 + u][j] for each token of the group.
#define MV_ADD(wv, j)                                                             \
    for (int u = 0; u < TOK; ++u) {                                            \
        if (u < nt) {                                                             \
            acc[u] += (wv) * xt[(long long)u * (long long)k + (j)];               \
        }                                                                         \
    }

// Every lane takes part in the shuffles (a finished warp adds zeros).
#define MV_END                                                                    \
    for (int u = 0; u < TOK; ++u) {                                            \
        float s = poot_warp_sum(acc[u]);                                          \
        if (row < n && lane == 0 && u < nt) {                                     \
            y[(long long)(t0 + u) * (long long)n + row] = s;                      \
        }                                                                         \
    }

// The block formats: 8 lanes share a 32-element block (lane slot s = lane % 8 takes 4 of its
// elements) and the warp's 4 lane groups take blocks g, g + 4, ... (g = lane / 8), so each
// load instruction of the warp reads 4 neighbouring blocks' bytes and x values, coalesced.
#define MV_SLOT (lane & 7)
#define MV_GROUP (lane >> 3)

template <int TOK>
__device__ __forceinline__ void mv_q8_0(const u8* __restrict__ w, const float* __restrict__ x,
                                    float* __restrict__ y, int n, int k, int t) {
    MV_BEGIN
    if (row < n) {
        int nb = k >> 5;
        int s = MV_SLOT;
        const u8* wr = w + (long long)row * (long long)nb * 34u;
        for (int b = MV_GROUP; b < nb; b += 4) {
            const u8* blk = wr + (long long)b * 34u;
            float d = poot_f16(poot_ld16(blk));
            u32 lo = poot_ld16(blk + 2 + 4 * s);
            u32 hi = poot_ld16(blk + 4 + 4 * s);
            int xb = b * 32 + 4 * s;
            float w0 = (float)(i8)(lo & 0xFFu) * d;
            float w1 = (float)(i8)(lo >> 8) * d;
            float w2 = (float)(i8)(hi & 0xFFu) * d;
            float w3 = (float)(i8)(hi >> 8) * d;
            MV_ADD(w0, xb)
            MV_ADD(w1, xb + 1)
            MV_ADD(w2, xb + 2)
            MV_ADD(w3, xb + 3)
        }
    }
    MV_END
}

template <int TOK>
__device__ __forceinline__ void mv_q4_0(const u8* __restrict__ w, const float* __restrict__ x,
                                    float* __restrict__ y, int n, int k, int t) {
    MV_BEGIN
    if (row < n) {
        int nb = k >> 5;
        int s = MV_SLOT;
        const u8* wr = w + (long long)row * (long long)nb * 18u;
        for (int b = MV_GROUP; b < nb; b += 4) {
            const u8* blk = wr + (long long)b * 18u;
            float d = poot_f16(poot_ld16(blk));
            // Byte j holds element j (low nibble) and element j + 16 (high nibble).
            u32 pair = poot_ld16(blk + 2 + 2 * s);
            int xb = b * 32 + 2 * s;
            float lo0 = (float)((int)(pair & 0xFu) - 8) * d;
            float hi0 = (float)((int)((pair >> 4) & 0xFu) - 8) * d;
            float lo1 = (float)((int)((pair >> 8) & 0xFu) - 8) * d;
            float hi1 = (float)((int)((pair >> 12) & 0xFu) - 8) * d;
            MV_ADD(lo0, xb)
            MV_ADD(lo1, xb + 1)
            MV_ADD(hi0, xb + 16)
            MV_ADD(hi1, xb + 17)
        }
    }
    MV_END
}

template <int TOK>
__device__ __forceinline__ void mv_q4_1(const u8* __restrict__ w, const float* __restrict__ x,
                                    float* __restrict__ y, int n, int k, int t) {
    MV_BEGIN
    if (row < n) {
        int nb = k >> 5;
        int s = MV_SLOT;
        const u8* wr = w + (long long)row * (long long)nb * 20u;
        for (int b = MV_GROUP; b < nb; b += 4) {
            // 20-byte blocks: 4-byte aligned, so d and m load as one u32 word.
            const u8* blk = wr + (long long)b * 20u;
            u32 dm = *(const u32*)blk;
            float d = poot_f16(dm & 0xFFFFu);
            float m = poot_f16(dm >> 16);
            u32 pair = poot_ld16(blk + 4 + 2 * s);
            int xb = b * 32 + 2 * s;
            float lo0 = (float)(int)(pair & 0xFu) * d + m;
            float hi0 = (float)(int)((pair >> 4) & 0xFu) * d + m;
            float lo1 = (float)(int)((pair >> 8) & 0xFu) * d + m;
            float hi1 = (float)(int)((pair >> 12) & 0xFu) * d + m;
            MV_ADD(lo0, xb)
            MV_ADD(lo1, xb + 1)
            MV_ADD(hi0, xb + 16)
            MV_ADD(hi1, xb + 17)
        }
    }
    MV_END
}

// Float weights: any k (no blocks), lane l takes elements l, l + 32, ... (coalesced).
template <int TOK>
__device__ __forceinline__ void mv_f16(const u8* __restrict__ w, const float* __restrict__ x,
                                    float* __restrict__ y, int n, int k, int t) {
    MV_BEGIN
    if (row < n) {
        const u16* wr = (const u16*)w + (long long)row * (long long)k;
        for (int j = lane; j < k; j += 32) {
            float wv = poot_f16(wr[j]);
            MV_ADD(wv, j)
        }
    }
    MV_END
}

template <int TOK>
__device__ __forceinline__ void mv_f32(const u8* __restrict__ w, const float* __restrict__ x,
                                    float* __restrict__ y, int n, int k, int t) {
    MV_BEGIN
    if (row < n) {
        const float* wr = (const float*)w + (long long)row * (long long)k;
        for (int j = lane; j < k; j += 32) {
            float wv = wr[j];
            MV_ADD(wv, j)
        }
    }
    MV_END
}

// The launchable kernels: one token, and MV_TOK tokens a warp.
extern "C" __global__ void matvec_q8_0(const u8* __restrict__ w, const float* __restrict__ x,
                                      float* __restrict__ y, int n, int k, int t) {
    mv_q8_0<1>(w, x, y, n, k, t);
}
extern "C" __global__ void matmul_q8_0(const u8* __restrict__ w, const float* __restrict__ x,
                                      float* __restrict__ y, int n, int k, int t) {
    mv_q8_0<MV_TOK>(w, x, y, n, k, t);
}
extern "C" __global__ void matvec_q4_0(const u8* __restrict__ w, const float* __restrict__ x,
                                      float* __restrict__ y, int n, int k, int t) {
    mv_q4_0<1>(w, x, y, n, k, t);
}
extern "C" __global__ void matmul_q4_0(const u8* __restrict__ w, const float* __restrict__ x,
                                      float* __restrict__ y, int n, int k, int t) {
    mv_q4_0<MV_TOK>(w, x, y, n, k, t);
}
extern "C" __global__ void matvec_q4_1(const u8* __restrict__ w, const float* __restrict__ x,
                                      float* __restrict__ y, int n, int k, int t) {
    mv_q4_1<1>(w, x, y, n, k, t);
}
extern "C" __global__ void matmul_q4_1(const u8* __restrict__ w, const float* __restrict__ x,
                                      float* __restrict__ y, int n, int k, int t) {
    mv_q4_1<MV_TOK>(w, x, y, n, k, t);
}
extern "C" __global__ void matvec_f16(const u8* __restrict__ w, const float* __restrict__ x,
                                      float* __restrict__ y, int n, int k, int t) {
    mv_f16<1>(w, x, y, n, k, t);
}
extern "C" __global__ void matmul_f16(const u8* __restrict__ w, const float* __restrict__ x,
                                      float* __restrict__ y, int n, int k, int t) {
    mv_f16<MV_TOK>(w, x, y, n, k, t);
}
extern "C" __global__ void matvec_f32(const u8* __restrict__ w, const float* __restrict__ x,
                                      float* __restrict__ y, int n, int k, int t) {
    mv_f32<1>(w, x, y, n, k, t);
}
extern "C" __global__ void matmul_f32(const u8* __restrict__ w, const float* __restrict__ x,
                                      float* __restrict__ y, int n, int k, int t) {
    mv_f32<MV_TOK>(w, x, y, n, k, t);
}
