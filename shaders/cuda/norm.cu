// RMS norm over rows of x [t, d] with an f32 weight [d] -> y [t, d], in the CPU runtime's
// operation order: each x*x rounded to f32 and summed in f64, mean = (float)(sum / d),
// scale = 1 / sqrt(mean + eps) in f32 (correctly rounded: NVRTC's default -prec-div and
// -prec-sqrt), y = (x * scale) * w. Only the f64 sum's order differs from the CPU's
// sequential one, which is far below an f32 rounding.
//
// Launch: block (256), grid (t). Requires blockDim.x == 256 (8 warps).
#include "common.cuh"

extern "C" __global__ void rms_norm_f32(const float* __restrict__ x,
                                        const float* __restrict__ w,
                                        float* __restrict__ y, int d, float eps) {
    __shared__ double partial[8];
    int t = blockIdx.x;
    const float* xr = x + (long long)t * (long long)d;
    float* yr = y + (long long)t * (long long)d;
    double sum = 0.0;
    for (int i = threadIdx.x; i < d; i += 256) {
        float sq = xr[i] * xr[i];
        sum += (double)sq;
    }
    sum = poot_warp_sum_f64(sum);
    if ((threadIdx.x & 31) == 0) {
        partial[threadIdx.x >> 5] = sum;
    }
    __syncthreads();
    double total = 0.0;
    for (int i = 0; i < 8; ++i) {
        total += partial[i];
    }
    float mean = (float)(total / (double)d);
    float scale = 1.0f / sqrtf(mean + eps);
    for (int i = threadIdx.x; i < d; i += 256) {
        yr[i] = (xr[i] * scale) * w[i];
    }
}
