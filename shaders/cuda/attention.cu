// Paged attention over the KV pool, in the CPU runtime's exact order: one kernel per stage.
//
// Pool layout per layer (K and V alike): [num_blocks * block_size slots, n_kv_heads, head_dim]
// f32; position p of a sequence lives at slot table[p / bs] * bs + p % bs. The host checks
// every index (slots, sequence ids, positions, table entries a token reads) before launch.
//
// Stages, each matching crates/poot-cpu/src/kernels/attention_exact.rs operation for
// operation (NVRTC --fmad=false): scores s_p = dot(q, k_p) * scale with the dot in 8 lanes
// (lane i % 8) summed ((0+4)+(1+5))+((2+6)+(3+7)) then the tail in order; e_p = expf(s_p - m)
// with m the row's max, summed in position order; out = (sum_p e_p * v_p) * (1 / sum), each
// output's terms added in position order. Only expf differs from the CPU's (ggml's expf).
#include "common.cuh"

// Writes this step's k and v rows [t, row] to their slots (-1: no write).
// Launch: grid (ceil(row / 256), t).
extern "C" __global__ void kv_write(const float* __restrict__ k, const float* __restrict__ v,
                                    const int* __restrict__ slots, float* __restrict__ kc,
                                    float* __restrict__ vc, int row) {
    int e = blockIdx.x * 256 + threadIdx.x;
    int t = blockIdx.y;
    int slot = slots[t];
    if (e < row && slot >= 0) {
        kc[(long long)slot * row + e] = k[(long long)t * row + e];
        vc[(long long)slot * row + e] = v[(long long)t * row + e];
    }
}

// The first position a token at `pos` reads: `window` > 0 keeps only its last `window`
// positions (a sliding-window layer), 0 every position.
__device__ __forceinline__ int poot_first(int pos, int window) {
    return (window > 0 && pos + 1 > window) ? pos + 1 - window : 0;
}

// The flat slot of position p under sequence `seq`'s block table.
__device__ __forceinline__ long long poot_slot(const int* tables, int seq, int max_blocks,
                                               int bs, int p) {
    return (long long)tables[(long long)seq * max_blocks + p / bs] * bs + p % bs;
}

// scores[(t * H + h) * ctx + p] for first <= p <= positions[t]; `softcap` > 0 caps each score
// as tanh(s * (1 / softcap)) * softcap (the CPU's order). Launch: grid (ceil(ctx / 256), t * H).
extern "C" __global__ void attn_scores(const float* __restrict__ q, const float* __restrict__ kc,
                                       const int* __restrict__ tables,
                                       const int* __restrict__ seqs,
                                       const int* __restrict__ positions,
                                       float* __restrict__ scores, int n_heads, int n_kv_heads,
                                       int head_dim, int bs, int max_blocks, int ctx,
                                       float scale, int window, float softcap) {
    int p = blockIdx.x * 256 + threadIdx.x;
    int th = blockIdx.y;
    int t = th / n_heads;
    int h = th % n_heads;
    if (p > positions[t] || p >= ctx || p < poot_first(positions[t], window)) {
        return;
    }
    int kvh = h / (n_heads / n_kv_heads);
    const float* qh = q + (long long)th * head_dim;
    long long slot = poot_slot(tables, seqs[t], max_blocks, bs, p);
    const float* kr = kc + (slot * n_kv_heads + kvh) * head_dim;
    float lane[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    int whole = head_dim - head_dim % 8;
    for (int i = 0; i < whole; i += 8) {
        for (int j = 0; j < 8; ++j) {
            float prod = qh[i + j] * kr[i + j];
            lane[j] += prod;
        }
    }
    float a = lane[0] + lane[4];
    float b = lane[1] + lane[5];
    float c = lane[2] + lane[6];
    float d = lane[3] + lane[7];
    float dot = (a + b) + (c + d);
    for (int i = whole; i < head_dim; ++i) {
        float prod = qh[i] * kr[i];
        dot += prod;
    }
    float sc = dot * scale;
    if (softcap > 0.0f) {
        sc = tanhf(sc * (1.0f / softcap)) * softcap;
    }
    scores[(long long)th * ctx + p] = sc;
}

// In place: scores -> e_p = expf(s_p - max), and inv[th] = 1 / sum_p e_p (position order).
// Launch: block (256), grid (t * H).
extern "C" __global__ void attn_softmax(float* __restrict__ scores, float* __restrict__ inv,
                                        const int* __restrict__ positions, int n_heads,
                                        int ctx, int window) {
    __shared__ float partial[8];
    int th = blockIdx.x;
    int len = positions[th / n_heads] + 1;
    int lo = poot_first(len - 1, window);
    float* s = scores + (long long)th * ctx;
    float m = -__uint_as_float(0x7F800000u);
    for (int p = lo + threadIdx.x; p < len; p += 256) {
        m = fmaxf(m, s[p]);
    }
    for (int o = 16; o > 0; o >>= 1) {
        m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
    }
    if ((threadIdx.x & 31) == 0) {
        partial[threadIdx.x >> 5] = m;
    }
    __syncthreads();
    m = partial[0];
    for (int i = 1; i < 8; ++i) {
        m = fmaxf(m, partial[i]);
    }
    for (int p = lo + threadIdx.x; p < len; p += 256) {
        s[p] = expf(s[p] - m);
    }
    __syncthreads();
    // The sum in position order, as the CPU adds it (one thread: len is a context, not more).
    if (threadIdx.x == 0) {
        float sum = 0.0f;
        for (int p = lo; p < len; ++p) {
            sum += s[p];
        }
        inv[th] = 1.0f / sum;
    }
}

// out[t, h, d] = (sum_p e_p * v_p[d]) * inv. Launch: grid (ceil(head_dim / 256), t * H).
extern "C" __global__ void attn_out(const float* __restrict__ scores,
                                    const float* __restrict__ inv, const float* __restrict__ vc,
                                    const int* __restrict__ tables, const int* __restrict__ seqs,
                                    const int* __restrict__ positions, float* __restrict__ out,
                                    int n_heads, int n_kv_heads, int head_dim, int bs,
                                    int max_blocks, int ctx, int window) {
    int d = blockIdx.x * 256 + threadIdx.x;
    int th = blockIdx.y;
    if (d >= head_dim) {
        return;
    }
    int t = th / n_heads;
    int kvh = (th % n_heads) / (n_heads / n_kv_heads);
    int len = positions[t] + 1;
    const float* e = scores + (long long)th * ctx;
    float acc = 0.0f;
    for (int p = poot_first(len - 1, window); p < len; ++p) {
        long long slot = poot_slot(tables, seqs[t], max_blocks, bs, p);
        float prod = e[p] * vc[(slot * n_kv_heads + kvh) * head_dim + d];
        acc += prod;
    }
    out[(long long)th * head_dim + d] = acc * inv[th];
}
