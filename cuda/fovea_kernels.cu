// fovea_kernels.cu -- foveated sampling kernels. ONE source, two builds:
//   nvcc -cubin -arch=sm_90 fovea_kernels.cu      -> __global__ kernels (pycuda loads them)
//   g++ -O3 -shared -fPIC -x c++ fovea_kernels.cu -> extern "C" CPU loops (ctypes)
// The math lives in fovea_kernels.cuh; this file only maps threads / loop indices to it.
#include "fovea_kernels.cuh"

#ifdef __CUDACC__
// =============================================================================== GPU
extern "C" {

// patches[b, n, ch, i, j]: one thread per output element; consecutive threads write
// consecutive j (coalesced stores) and read neighbouring pixels of the same level.
__global__ void gather_patches(const float* __restrict__ pyr,
                               const long long* __restrict__ offsets,
                               const int* __restrict__ sizes, int num_levels, int batch,
                               int num_tokens, int img_h, int img_w, int c, int p,
                               const float* __restrict__ centers,  // [B, N, 2]
                               const float* __restrict__ lods,     // [B, N]
                               float* __restrict__ out) {          // [B, N, C, p, p]
    const long long total = (long long)batch * num_tokens * c * p * p;
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < total;
         e += (long long)gridDim.x * blockDim.x) {
        const int j = e % p, i = (e / p) % p, ch = (e / (p * p)) % c;
        const long long t = e / ((long long)p * p * c);              // token index b * N + n
        const int b = (int)(t / num_tokens);
        out[e] = gather_element(pyr, offsets, sizes, num_levels, img_h, img_w, c, p, b,
                                centers[2 * t], centers[2 * t + 1], lods[t], i, j, ch);
    }
}

// out[b, ch, y, x] = bilinear(image[b, ch], lut[b or 0, y, x]); zero outside the image.
__global__ void remap_lut(const float* __restrict__ image, int batch, int c, int h, int w,
                          const float* __restrict__ lut, int lut_batch, int ho, int wo,
                          float* __restrict__ out) {
    const long long total = (long long)batch * c * ho * wo;
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < total;
         e += (long long)gridDim.x * blockDim.x) {
        const long long pix = e % ((long long)ho * wo);
        const long long bc = e / ((long long)ho * wo);
        const int b = (int)(bc / c);
        const long long l = ((lut_batch == 1 ? 0 : (long long)b) * ho * wo + pix) * 2;
        out[e] = remap_element(image + bc * h * w, h, w, lut[l], lut[l + 1]);
    }
}

// One thread per candidate slot (b, m); selection of the first N valid distinct candidates
// happens afterwards (fovea_core.allocators.cortical.select_candidates, or the C++
// select_candidates_cpu below).
__global__ void v1_candidates(int img_h, int img_w, int patch, int num_levels, int fs_max,
                              int r_max, int a_max, double ppd, double e0, int batch,
                              int k_slots,
                              const double* __restrict__ fix_px,  // [B, 2]
                              const int* __restrict__ fs_b,       // [B] foveal block side
                              const int* __restrict__ a_b, const int* __restrict__ r_b,
                              const int* __restrict__ stride,
                              const double* __restrict__ rstep,
                              float* __restrict__ cxy, int* __restrict__ level,
                              int* __restrict__ valid) {
    const V1Params P = {img_h, img_w, patch, num_levels, fs_max, r_max, a_max, ppd, e0};
    const long long total = (long long)batch * k_slots;
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < total;
         e += (long long)gridDim.x * blockDim.x) {
        const int b = (int)(e / k_slots), m = (int)(e % k_slots);
        v1_candidate(P, fix_px[2 * b], fix_px[2 * b + 1], fs_b[b], a_b[b], r_b[b], stride[b],
                     rstep[b], m, &cxy[2 * e], &cxy[2 * e + 1], &level[e], &valid[e]);
    }
}

}  // extern "C"
#else
// =============================================================================== CPU
#include <unordered_set>
#define FOVEA_MAX_PATCH 256  // largest patch side of the CPU loop (checked in Python)

extern "C" {

int fovea_abi_version() { return 1; }

// Same arithmetic as gather_element (bit-identical results), with the per-axis tap
// computations hoisted out of the p x p x C loop. Images of a batch run in parallel
// (OpenMP) when there are enough tokens to pay for the threads.
void gather_patches_cpu(const float* pyr, const long long* offsets, const int* sizes,
                        int num_levels, int batch, int num_tokens, int img_h, int img_w, int c,
                        int p, const float* centers, const float* lods, float* out) {
    const long long tokens = (long long)batch * num_tokens;
#pragma omp parallel for schedule(static) if (tokens >= 2048)
    for (long long t = 0; t < tokens; ++t) {
        const int b = (int)(t / num_tokens);
        const float cx = centers[2 * t], cy = centers[2 * t + 1], lod = lods[t];
        const float step = exp2f(lod);
        int lo = (int)floorf(lod);
        if (lo > num_levels - 1) lo = num_levels - 1;
        const float frac = lod - (float)lo;
        float* o = out + t * c * p * p;
        Tap tx[FOVEA_MAX_PATCH], ty[FOVEA_MAX_PATCH];
        for (int q = 0; q < 2; ++q) {
            const int m = lo + q;
            if (q == 1 && !(frac > 0.0f && m < num_levels)) break;
            const float wq = q == 0 ? 1.0f - frac : frac;
            const float s = exp2f((float)m);
            const int h = sizes[2 * m], w = sizes[2 * m + 1];
            const float* img = level_image(pyr, offsets, sizes, m, c, b);
            for (int k = 0; k < p; ++k) {
                tx[k] = axis_tap(sample_index_coord(cx, img_w, k, p, step, s), w);
                ty[k] = axis_tap(sample_index_coord(cy, img_h, k, p, step, s), h);
            }
            for (int ch = 0; ch < c; ++ch)
                for (int i = 0; i < p; ++i) {
                    float* row = o + ((long long)ch * p + i) * p;
                    for (int j = 0; j < p; ++j) {
                        const float v = bilerp(img, w, c, ty[i], tx[j], ch);
                        row[j] = q == 0 ? v * wq : row[j] + v * wq;
                    }
                }
        }
    }
}

void remap_lut_cpu(const float* image, int batch, int c, int h, int w, const float* lut,
                   int lut_batch, int ho, int wo, float* out) {
    const long long planes = (long long)batch * c;
#pragma omp parallel for schedule(static) if (planes * ho * wo >= (1LL << 20))
    for (long long bc = 0; bc < planes; ++bc) {
        const long long b = bc / c;
        const float* L = lut + (lut_batch == 1 ? 0 : b) * (long long)ho * wo * 2;
        float* o = out + bc * ho * wo;
        for (long long pix = 0; pix < (long long)ho * wo; ++pix)
            o[pix] = remap_element(image + bc * h * w, h, w, L[2 * pix], L[2 * pix + 1]);
    }
}

void v1_candidates_cpu(int img_h, int img_w, int patch, int num_levels, int fs_max,
                       int r_max, int a_max, double ppd, double e0, int batch, int k_slots,
                       const double* fix_px, const int* fs_b, const int* a_b, const int* r_b,
                       const int* stride, const double* rstep, float* cxy,
                       int* level, int* valid) {
    const V1Params P = {img_h, img_w, patch, num_levels, fs_max, r_max, a_max, ppd, e0};
    for (long long e = 0; e < (long long)batch * k_slots; ++e) {
        const int b = (int)(e / k_slots), m = (int)(e % k_slots);
        v1_candidate(P, fix_px[2 * b], fix_px[2 * b + 1], fs_b[b], a_b[b], r_b[b], stride[b],
                     rstep[b], m, &cxy[2 * e], &cxy[2 * e + 1], &level[e], &valid[e]);
    }
}

// Keep, per image, the first `budget` valid candidates whose key (level, centre rounded to
// 1/8 px; TokenSet.keys) was not seen before. Writes chosen slot indices [B, budget];
// returns -1 - b if image b has fewer than `budget` such candidates, else 0.
int select_candidates_cpu(int batch, int k_slots, int budget, int img_h, int img_w,
                          const float* cxy, const int* level, const int* valid, long long* chosen) {
    for (int b = 0; b < batch; ++b) {
        std::unordered_set<long long> seen;
        int got = 0;
        for (int m = 0; m < k_slots && got < budget; ++m) {
            const long long e = (long long)b * k_slots + m;
            if (!valid[e]) continue;
            const long long kx = (long long)nearbyintf(cxy[2 * e] * (float)img_w * 8.0f);
            const long long ky = (long long)nearbyintf(cxy[2 * e + 1] * (float)img_h * 8.0f);
            const long long key = ((long long)level[e] * (1LL << 20) + ky) * (1LL << 20) + kx;
            if (!seen.insert(key).second) continue;
            chosen[(long long)b * budget + got++] = m;
        }
        if (got < budget) return -1 - b;
    }
    return 0;
}

}  // extern "C"
#endif
