// Elementwise ops, RoPE, embedding rows and row gathers: one thread per output element.
// Launch: block (256), grid (ceil(count / 256)) unless a kernel says otherwise.
#include "common.cuh"

// out[i] = a[i] + b[i % nb]: b is a's shape or one row broadcast over a's rows.
extern "C" __global__ void add_f32(const float* __restrict__ a, const float* __restrict__ b,
                                   float* __restrict__ out, long long n, long long nb) {
    long long i = (long long)blockIdx.x * 256 + threadIdx.x;
    if (i < n) {
        out[i] = a[i] + b[i % nb];
    }
}

extern "C" __global__ void mul_f32(const float* __restrict__ a, const float* __restrict__ b,
                                   float* __restrict__ out, long long n, long long nb) {
    long long i = (long long)blockIdx.x * 256 + threadIdx.x;
    if (i < n) {
        out[i] = a[i] * b[i % nb];
    }
}

// x / (1 + exp(-x)); expf is within 2 ulp on the GPU, the host libm's on the CPU shim.
extern "C" __global__ void silu_f32(const float* __restrict__ x, float* __restrict__ out,
                                    long long n) {
    long long i = (long long)blockIdx.x * 256 + threadIdx.x;
    if (i < n) {
        float v = x[i];
        out[i] = v / (1.0f + expf(-v));
    }
}

// GELU, tanh approximation (ggml's and HF's "gelu_pytorch_tanh"), in the CPU's order:
// 0.5 * x * (1 + tanh(sqrt(2 / pi) * x * (1 + 0.044715 * x * x))); tanhf within 2 ulp.
extern "C" __global__ void gelu_f32(const float* __restrict__ x, float* __restrict__ out,
                                    long long n) {
    long long i = (long long)blockIdx.x * 256 + threadIdx.x;
    if (i < n) {
        float v = x[i];
        float inner = 0.7978845608028654f * v * (1.0f + 0.044715f * v * v);
        out[i] = 0.5f * v * (1.0f + tanhf(inner));
    }
}

// Soft-capping: tanh(x * (1 / cap)) * cap (Gemma 2's final logits), the CPU's order.
extern "C" __global__ void softcap_f32(const float* __restrict__ x, float* __restrict__ out,
                                       long long n, float cap) {
    long long i = (long long)blockIdx.x * 256 + threadIdx.x;
    if (i < n) {
        out[i] = tanhf(x[i] * (1.0f / cap)) * cap;
    }
}

// Rotary embedding of x [t, n_heads * head_dim] -> out, with (cos, sin) pairs cs [t, half]
// computed on the host by the CPU runtime's recipe (so angles are the CPU's bits). Pairs are
// (2p, 2p + 1) (interleaved) or (p, p + half) (neox); dims past 2 * half are copied.
// Products are rounded before the add/sub, as the CPU's exact path does.
extern "C" __global__ void rope_f32(const float* __restrict__ x, const float* __restrict__ cs,
                                    float* __restrict__ out, int t, int n_heads, int head_dim,
                                    int half, int neox) {
    long long i = (long long)blockIdx.x * 256 + threadIdx.x;
    long long total = (long long)t * n_heads * head_dim;
    if (i >= total) {
        return;
    }
    int j = (int)(i % head_dim);
    long long head = i / head_dim;
    int tok = (int)(head / n_heads);
    const float* xh = x + head * head_dim;
    const float* c = cs + (long long)tok * (long long)half * 2;
    float r;
    if (j >= 2 * half) {
        r = xh[j];
    } else if (neox) {
        int p = j < half ? j : j - half;
        float x0 = xh[p];
        float x1 = xh[p + half];
        float co = c[2 * p];
        float si = c[2 * p + 1];
        if (j < half) {
            float a = x0 * co;
            float b = x1 * si;
            r = a - b;
        } else {
            float a = x0 * si;
            float b = x1 * co;
            r = a + b;
        }
    } else {
        int p = j >> 1;
        float x0 = xh[2 * p];
        float x1 = xh[2 * p + 1];
        float co = c[2 * p];
        float si = c[2 * p + 1];
        if ((j & 1) == 0) {
            float a = x0 * co;
            float b = x1 * si;
            r = a - b;
        } else {
            float a = x0 * si;
            float b = x1 * co;
            r = a + b;
        }
    }
    out[i] = r;
}

// Element j of row `row` of a stored [rows, dim] tensor, decoded exactly.
__device__ __forceinline__ float poot_elem(const u8* table, int dtype, long long row, int dim,
                                           int j) {
    if (dtype == POOT_F32) {
        return ((const float*)table)[row * dim + j];
    }
    if (dtype == POOT_F16) {
        return poot_f16(((const u16*)table)[row * dim + j]);
    }
    long long blk = row * (dim >> 5) + (j >> 5);
    int e = j & 31;
    if (dtype == POOT_Q8_0) {
        const u8* b = table + blk * 34;
        return (float)(i8)b[2 + e] * poot_f16(poot_ld16(b));
    }
    if (dtype == POOT_Q4_0) {
        const u8* b = table + blk * 18;
        u32 q = b[2 + (e & 15)];
        u32 v = e < 16 ? (q & 0xFu) : (q >> 4);
        return (float)((int)v - 8) * poot_f16(poot_ld16(b));
    }
    // POOT_Q4_1
    const u8* b = table + blk * 20;
    u32 q = b[4 + (e & 15)];
    u32 v = e < 16 ? (q & 0xFu) : (q >> 4);
    return (float)(int)v * poot_f16(poot_ld16(b)) + poot_f16(poot_ld16(b + 2));
}

// out [n_ids, dim] = rows ids[i] of the table (ids checked on the host before launch).
// Launch: grid (ceil(dim / 256), n_ids).
extern "C" __global__ void embedding(const u8* __restrict__ table, const int* __restrict__ ids,
                                     float* __restrict__ out, int dim, int dtype) {
    int j = blockIdx.x * 256 + threadIdx.x;
    int i = blockIdx.y;
    if (j < dim) {
        out[(long long)i * (long long)dim + j] = poot_elem(table, dtype, ids[i], dim, j);
    }
}

// out [n] = the n stored float words of w as f32, exactly: F32 copied, F16 widened (poot_f16),
// BF16 the high half of an f32. A graph's cast that no reading kernel fused.
extern "C" __global__ void cast_f32(const u8* __restrict__ w, float* __restrict__ out,
                                    long long n, int dtype) {
    long long i = (long long)blockIdx.x * 256 + threadIdx.x;
    if (i < n) {
        if (dtype == POOT_F32) {
            out[i] = ((const float*)w)[i];
        } else if (dtype == POOT_F16) {
            out[i] = poot_f16(poot_ld16(w + 2 * i));
        } else {
            out[i] = __uint_as_float(poot_ld16(w + 2 * i) << 16);
        }
    }
}

// out [o, w] = columns start..start + w of x [o, in_w]: a slice along one axis, seen as
// [outer, axis * inner] (the host folds the axes). Grid (ceil(w / 256), o).
extern "C" __global__ void slice_cols(const float* __restrict__ x, float* __restrict__ out,
                                      int in_w, int w, int start) {
    int j = blockIdx.x * 256 + threadIdx.x;
    long long i = blockIdx.y;
    if (j < w) {
        out[i * (long long)w + j] = x[i * (long long)in_w + start + j];
    }
}

// out [r, d] = rows rows[i] of x [., d] (rows checked on the host). Grid (ceil(d / 256), r).
extern "C" __global__ void gather_rows(const float* __restrict__ x, const int* __restrict__ rows,
                                       float* __restrict__ out, int d) {
    int j = blockIdx.x * 256 + threadIdx.x;
    int i = blockIdx.y;
    if (j < d) {
        out[(long long)i * (long long)d + j] = x[(long long)rows[i] * (long long)d + j];
    }
}
