// x [t, k] times W stored [n, k] -> y [t, n], the weight read packed in place.
//
// Launch: block (256), grid (ceil(n / 8), ceil(t / MV_TOK)). Each warp owns one output row
// for up to MV_TOK tokens: lane l takes 32-element blocks l, l + 32, ... of the row, decodes
// each exactly once (the reference dequantizer's `q * d` / `q * d + m`, unfused) and
// accumulates w * x in f32 for each of its tokens, so a prompt reads each weight t / MV_TOK
// times rather than t times. The warp sums its lanes in a fixed xor tree. Each token's
// additions happen in the same order whatever the token count, so a row's result does not
// depend on the tokens beside it, and the order is the same on the GPU and the CPU shim (NVRTC
// runs with --fmad=false, the shim with -ffp-contract=off): both give the same bits.
// Requires k % 32 == 0 for the block formats (every block is whole by the format).
#include "common.cuh"

#define MV_ROWS 8
#define MV_TOK 4

// The prologue every matvec shares: this warp's row, lane and token group, zeroed sums.
#define MV_BEGIN                                                                  \
    int row = blockIdx.x * MV_ROWS + (threadIdx.x >> 5);                          \
    int lane = threadIdx.x & 31;                                                  \
    int t0 = blockIdx.y * MV_TOK;                                                 \
    int nt = t - t0 < MV_TOK ? t - t0 : MV_TOK;                                   \
    float acc[MV_TOK];                                                            \
    for (int u = 0; u < MV_TOK; ++u) {                                            \
        acc[u] = 0.0f;                                                            \
    }                                                                             \
    const float* xt = x + (long long)t0 * (long long)k;

// acc[u] += wv * x[t0 + u][j] for each token of the group.
#define MV_ADD(wv, j)                                                             \
    for (int u = 0; u < MV_TOK; ++u) {                                            \
        if (u < nt) {                                                             \
            acc[u] += (wv) * xt[(long long)u * (long long)k + (j)];               \
        }                                                                         \
    }

// Every lane takes part in the shuffles (a finished warp adds zeros).
#define MV_END                                                                    \
    for (int u = 0; u < MV_TOK; ++u) {                                            \
        float s = poot_warp_sum(acc[u]);                                          \
        if (row < n && lane == 0 && u < nt) {                                     \
            y[(long long)(t0 + u) * (long long)n + row] = s;                      \
        }                                                                         \
    }

extern "C" __global__ void matvec_q8_0(const u8* __restrict__ w, const float* __restrict__ x,
                                       float* __restrict__ y, int n, int k, int t) {
    MV_BEGIN
    if (row < n) {
        int nb = k >> 5;
        const u8* wr = w + (long long)row * (long long)nb * 34u;
        for (int b = lane; b < nb; b += 32) {
            const u8* blk = wr + (long long)b * 34u;
            float d = poot_f16(poot_ld16(blk));
            int xb = b * 32;
            for (int i = 0; i < 16; ++i) {
                u32 pair = poot_ld16(blk + 2 + 2 * i);
                float w0 = (float)(i8)(pair & 0xFFu) * d;
                float w1 = (float)(i8)(pair >> 8) * d;
                MV_ADD(w0, xb + 2 * i)
                MV_ADD(w1, xb + 2 * i + 1)
            }
        }
    }
    MV_END
}

extern "C" __global__ void matvec_q4_0(const u8* __restrict__ w, const float* __restrict__ x,
                                       float* __restrict__ y, int n, int k, int t) {
    MV_BEGIN
    if (row < n) {
        int nb = k >> 5;
        const u8* wr = w + (long long)row * (long long)nb * 18u;
        for (int b = lane; b < nb; b += 32) {
            const u8* blk = wr + (long long)b * 18u;
            float d = poot_f16(poot_ld16(blk));
            int xb = b * 32;
            for (int i = 0; i < 8; ++i) {
                u32 pair = poot_ld16(blk + 2 + 2 * i);
                // Byte j holds element j (low nibble) and element j + 16 (high nibble).
                float lo0 = (float)((int)(pair & 0xFu) - 8) * d;
                float hi0 = (float)((int)((pair >> 4) & 0xFu) - 8) * d;
                float lo1 = (float)((int)((pair >> 8) & 0xFu) - 8) * d;
                float hi1 = (float)((int)((pair >> 12) & 0xFu) - 8) * d;
                MV_ADD(lo0, xb + 2 * i)
                MV_ADD(lo1, xb + 2 * i + 1)
                MV_ADD(hi0, xb + 2 * i + 16)
                MV_ADD(hi1, xb + 2 * i + 17)
            }
        }
    }
    MV_END
}

extern "C" __global__ void matvec_q4_1(const u8* __restrict__ w, const float* __restrict__ x,
                                       float* __restrict__ y, int n, int k, int t) {
    MV_BEGIN
    if (row < n) {
        int nb = k >> 5;
        const u8* wr = w + (long long)row * (long long)nb * 20u;
        for (int b = lane; b < nb; b += 32) {
            // 20-byte blocks: 4-byte aligned, so the quants load as four u32 words.
            const u32* blk = (const u32*)(wr + (long long)b * 20u);
            u32 dm = blk[0];
            float d = poot_f16(dm & 0xFFFFu);
            float m = poot_f16(dm >> 16);
            int xb = b * 32;
            for (int i = 0; i < 4; ++i) {
                u32 q = blk[1 + i];
                for (int j = 0; j < 4; ++j) {
                    u32 byte = (q >> (8 * j)) & 0xFFu;
                    float lo = (float)(int)(byte & 0xFu) * d + m;
                    float hi = (float)(int)(byte >> 4) * d + m;
                    MV_ADD(lo, xb + 4 * i + j)
                    MV_ADD(hi, xb + 4 * i + j + 16)
                }
            }
        }
    }
    MV_END
}

// Float weights: any k (no blocks), lane l takes elements l, l + 32, ... (coalesced).
extern "C" __global__ void matvec_f16(const u8* __restrict__ w, const float* __restrict__ x,
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

extern "C" __global__ void matvec_f32(const u8* __restrict__ w, const float* __restrict__ x,
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
