// x [t, k] times W stored [n, k] -> y [t, n], the weight read packed in place.
//
// Launch: block (256), grid (ceil(n / 8), t). Each warp owns one output row: lane l takes
// 32-element blocks l, l + 32, ... of the row, decodes each exactly (the reference
// dequantizer's `q * d` / `q * d + m`, unfused), accumulates w * x in f32, and the warp sums
// its lanes in a fixed xor tree. The order is the same on the GPU and the CPU shim (NVRTC runs
// with --fmad=false, the shim with -ffp-contract=off), so both give the same bits.
// Requires k % 32 == 0 for the block formats (every block is whole by the format).
#include "common.cuh"

#define MV_ROWS 8

extern "C" __global__ void matvec_q8_0(const u8* __restrict__ w, const float* __restrict__ x,
                                       float* __restrict__ y, int n, int k) {
    int row = blockIdx.x * MV_ROWS + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    int t = blockIdx.y;
    float acc = 0.0f;
    if (row < n) {
        int nb = k >> 5;
        const u8* wr = w + (long long)row * (long long)nb * 34u;
        const float* xt = x + (long long)t * (long long)k;
        for (int b = lane; b < nb; b += 32) {
            const u8* blk = wr + (long long)b * 34u;
            float d = poot_f16(poot_ld16(blk));
            const float* xb = xt + b * 32;
            for (int i = 0; i < 16; ++i) {
                u32 pair = poot_ld16(blk + 2 + 2 * i);
                float w0 = (float)(i8)(pair & 0xFFu) * d;
                float w1 = (float)(i8)(pair >> 8) * d;
                acc += w0 * xb[2 * i];
                acc += w1 * xb[2 * i + 1];
            }
        }
    }
    // Every lane takes part in the shuffles (a finished warp adds zeros).
    acc = poot_warp_sum(acc);
    if (row < n && lane == 0) {
        y[(long long)t * (long long)n + row] = acc;
    }
}

extern "C" __global__ void matvec_q4_0(const u8* __restrict__ w, const float* __restrict__ x,
                                       float* __restrict__ y, int n, int k) {
    int row = blockIdx.x * MV_ROWS + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    int t = blockIdx.y;
    float acc = 0.0f;
    if (row < n) {
        int nb = k >> 5;
        const u8* wr = w + (long long)row * (long long)nb * 18u;
        const float* xt = x + (long long)t * (long long)k;
        for (int b = lane; b < nb; b += 32) {
            const u8* blk = wr + (long long)b * 18u;
            float d = poot_f16(poot_ld16(blk));
            const float* xb = xt + b * 32;
            for (int i = 0; i < 8; ++i) {
                u32 pair = poot_ld16(blk + 2 + 2 * i);
                // Byte j holds element j (low nibble) and element j + 16 (high nibble).
                float lo0 = (float)((int)(pair & 0xFu) - 8) * d;
                float hi0 = (float)((int)((pair >> 4) & 0xFu) - 8) * d;
                float lo1 = (float)((int)((pair >> 8) & 0xFu) - 8) * d;
                float hi1 = (float)((int)((pair >> 12) & 0xFu) - 8) * d;
                acc += lo0 * xb[2 * i];
                acc += lo1 * xb[2 * i + 1];
                acc += hi0 * xb[2 * i + 16];
                acc += hi1 * xb[2 * i + 17];
            }
        }
    }
    acc = poot_warp_sum(acc);
    if (row < n && lane == 0) {
        y[(long long)t * (long long)n + row] = acc;
    }
}

extern "C" __global__ void matvec_q4_1(const u8* __restrict__ w, const float* __restrict__ x,
                                       float* __restrict__ y, int n, int k) {
    int row = blockIdx.x * MV_ROWS + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    int t = blockIdx.y;
    float acc = 0.0f;
    if (row < n) {
        int nb = k >> 5;
        const u8* wr = w + (long long)row * (long long)nb * 20u;
        const float* xt = x + (long long)t * (long long)k;
        for (int b = lane; b < nb; b += 32) {
            // 20-byte blocks: 4-byte aligned, so the quants load as four u32 words.
            const u32* blk = (const u32*)(wr + (long long)b * 20u);
            u32 dm = blk[0];
            float d = poot_f16(dm & 0xFFFFu);
            float m = poot_f16(dm >> 16);
            const float* xb = xt + b * 32;
            for (int i = 0; i < 4; ++i) {
                u32 q = blk[1 + i];
                for (int j = 0; j < 4; ++j) {
                    u32 byte = (q >> (8 * j)) & 0xFFu;
                    float lo = (float)(int)(byte & 0xFu) * d + m;
                    float hi = (float)(int)(byte >> 4) * d + m;
                    acc += lo * xb[4 * i + j];
                    acc += hi * xb[4 * i + j + 16];
                }
            }
        }
    }
    acc = poot_warp_sum(acc);
    if (row < n && lane == 0) {
        y[(long long)t * (long long)n + row] = acc;
    }
}

// Float weights: any k (no blocks), lane l takes elements l, l + 32, ... (coalesced).
extern "C" __global__ void matvec_f16(const u8* __restrict__ w, const float* __restrict__ x,
                                      float* __restrict__ y, int n, int k) {
    int row = blockIdx.x * MV_ROWS + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    int t = blockIdx.y;
    float acc = 0.0f;
    if (row < n) {
        const u16* wr = (const u16*)w + (long long)row * (long long)k;
        const float* xt = x + (long long)t * (long long)k;
        for (int j = lane; j < k; j += 32) {
            acc += poot_f16(wr[j]) * xt[j];
        }
    }
    acc = poot_warp_sum(acc);
    if (row < n && lane == 0) {
        y[(long long)t * (long long)n + row] = acc;
    }
}

extern "C" __global__ void matvec_f32(const u8* __restrict__ w, const float* __restrict__ x,
                                      float* __restrict__ y, int n, int k) {
    int row = blockIdx.x * MV_ROWS + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    int t = blockIdx.y;
    float acc = 0.0f;
    if (row < n) {
        const float* wr = (const float*)w + (long long)row * (long long)k;
        const float* xt = x + (long long)t * (long long)k;
        for (int j = lane; j < k; j += 32) {
            acc += wr[j] * xt[j];
        }
    }
    acc = poot_warp_sum(acc);
    if (row < n && lane == 0) {
        y[(long long)t * (long long)n + row] = acc;
    }
}
