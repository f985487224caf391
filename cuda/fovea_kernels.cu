// fovea_kernels.cu -- foveated sampling kernels. ONE source, two builds:
//   nvcc -cubin -arch=sm_90 -fmad=false fovea_kernels.cu -> __global__ kernels (launched on
//        the current torch stream by fovea_core.kernels, through the CUDA driver API or pycuda)
//   g++ -O3 -ffp-contract=off -shared -fPIC -x c++ fovea_kernels.cu -> extern "C" CPU loops
// The math lives in fovea_kernels.cuh; this file only maps threads / loop indices to it.
#include "fovea_kernels.cuh"

#ifdef __CUDACC__
// =============================================================================== GPU
extern "C" {

// patches[t, ch, i, j] for token t = b * N + n. One block per token (blockIdx.x = t, a
// grid-stride loop over tokens when there are more than gridDim.x), one thread per sample
// (i, j) computing ALL channels: the token's constants are read once per thread, 32-bit
// index arithmetic, consecutive threads write consecutive j (coalesced stores), and a
// grid-aligned token reads one tap per sample (see lerp_exact).
__global__ void gather_patches(const LevelTable T, int batch, int num_tokens, int img_h,
                               int img_w, int p,
                               const float* __restrict__ centers,  // [B, N, 2]
                               const float* __restrict__ lods,     // [B, N]
                               const float* __restrict__ steps,    // [B, N] = 2^lod
                               float* __restrict__ out) {          // [B, N, C, p, p]
    const int pp = p * p;
    const int tokens = batch * num_tokens;
    for (int t = blockIdx.x; t < tokens; t += gridDim.x) {
        const int b = t / num_tokens;
        const TokenConst tc = token_const(centers[2 * t], centers[2 * t + 1], lods[t],
                                          steps[t], img_h, img_w, T.num_levels);
        float* o = out + (long long)t * T.channels * pp;
        for (int s = threadIdx.x; s < pp; s += blockDim.x)
            gather_sample(T, tc, b, p, s / p, s % p, o + s, pp);
    }
}

#define GATHER_TOKENS_BLOCK 256

// The fused gather (see gather_token_quad): NHWC4 pyramid in, [B, N, merge^2, C, T, p/merge,
// p/merge] out (fp32 or bf16). Each block holds tpb = blockDim.x / quads-per-token tokens
// (at least one), one thread per quad of four consecutive samples of a block: consecutive
// threads read neighbouring pixels (128-bit loads) and write consecutive 16-byte pieces of
// the output (coalesced). The grid is persistent (a grid-stride loop; the caller sizes it to fill the GPU once), so a small batch
// costs one launch and a large one no more blocks than the device runs at once. Launched
// with GATHER_TOKENS_BLOCK threads, at least 2 blocks an SM (at most 128 registers a thread;
// 3 blocks would cap it at 80, and ptxas then spills: `kernel_resources`), each thread
// keeping its quad's 4 samples x 4 taps in flight.
__global__ void __launch_bounds__(GATHER_TOKENS_BLOCK, 2) gather_tokens(const LevelTable T,
        int batch, int num_tokens, int img_h, int img_w, int p, int merge, int channels,
        int temporal, int bf16,
        const float* __restrict__ centers,  // [B, N, 2]
        const float* __restrict__ lods,     // [B, N]
        const float* __restrict__ steps,    // [B, N] = 2^lod
        void* __restrict__ out) {           // [B, N, merge^2, C, T, qs, qs]
    const int qs = p / merge, qpt = merge * merge * ((qs * qs + 3) / 4);   // quads a token
    const int tpt = qpt < (int)blockDim.x ? qpt : (int)blockDim.x;   // threads per token
    const int tpb = (int)blockDim.x / tpt;                            // tokens per block
    const int lt = (int)threadIdx.x / tpt, lq = (int)threadIdx.x - lt * tpt;
    if (lt >= tpb) return;                               // the block's spare threads
    const int tokens = batch * num_tokens;
    const long long token_bytes = (long long)channels * temporal * p * p * (bf16 ? 2 : 4);
    for (int t0 = blockIdx.x * tpb; t0 < tokens; t0 += gridDim.x * tpb) {
        const int t = t0 + lt;
        if (t >= tokens) break;
        const int b = t / num_tokens;
        const TokenConst tc = token_const(centers[2 * t], centers[2 * t + 1], lods[t],
                                          steps[t], img_h, img_w, T.num_levels);
        for (int quad = lq; quad < qpt; quad += tpt)
            gather_token_quad(T, tc, b, p, merge, quad, channels, temporal, bf16,
                              (char*)out + (long long)t * token_bytes);
    }
}

// One pyramid step: level `src` of table S -> level `dst` of table D (their sizes must be
// ceil(h / 2), ceil(w / 2)); one thread per output pixel, all channels.
__global__ void pyr_down(const LevelTable S, int src, const LevelTable D, int dst, int batch) {
    const int ho = D.h[dst], wo = D.w[dst], hi = S.h[src], wi = S.w[src];
    const int per_image = ho * wo;
    const int total = batch * per_image;                 // checked < 2^31 by the caller
    for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += gridDim.x * blockDim.x) {
        const int b = e / per_image, pix = e - b * per_image;
        const int oy = pix / wo, ox = pix - oy * wo;
        const float* in = level_image(S, src, b);
        float* o = (float*)level_image(D, dst, b) + oy * D.sy[dst] + ox * D.sx[dst];
        for (int ch = 0; ch < S.channels; ++ch)
            o[ch * D.sc[dst]] = pyr_down_element(in + ch * S.sc[src], hi, wi, S.sy[src],
                                                 S.sx[src], oy, ox);
    }
}

// out[b, ch, y, x] = bilinear(image[b, ch], lut[b or 0, y, x]); zero outside the image.
// The image is read in place with element strides (sb, sc, sy, sx) (NCHW or channels
// last). One thread per output pixel: the LUT entry and the tap weights are computed once
// and applied to every channel.
__global__ void remap_lut(const float* __restrict__ image, long long sb, int sc, int sy, int sx,
                          int batch, int c, int h, int w, const float* __restrict__ lut,
                          int lut_batch, int ho, int wo, float* __restrict__ out) {
    const int per_image = ho * wo;
    const int total = batch * per_image;                 // checked < 2^31 by the caller
    for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += gridDim.x * blockDim.x) {
        const int b = e / per_image, pix = e - b * per_image;
        const float* L = lut + 2 * ((lut_batch == 1 ? 0 : b) * per_image + pix);
        const RemapTaps r = remap_taps(h, w, sy, sx, L[0], L[1]);
        const float* img = image + (long long)b * sb;
        float* o = out + (long long)b * c * per_image + pix;
        for (int ch = 0; ch < c; ++ch)
            o[ch * per_image] = remap_apply(img + ch * sc, r);
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
    const int total = batch * k_slots;
    for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += gridDim.x * blockDim.x) {
        const int b = e / k_slots, m = e - b * k_slots;
        v1_candidate(P, fix_px[2 * b], fix_px[2 * b + 1], fs_b[b], a_b[b], r_b[b], stride[b],
                     rstep[b], m, &cxy[2 * e], &cxy[2 * e + 1], &level[e], &valid[e]);
    }
}

}  // extern "C"
#else
// =============================================================================== CPU
#include <unordered_set>

extern "C" {

int fovea_abi_version() { return 2; }
int fovea_max_levels() { return FOVEA_MAX_LEVELS; }
int fovea_level_table_bytes() { return (int)sizeof(LevelTable); }

// The same arithmetic as the GPU kernel (bit-identical results): per token and level the p
// x-taps and p y-taps are computed once (sample_base_pos, index_coord, axis_tap), then every
// sample and channel is one bilerp. Tokens of a batch run in parallel (OpenMP) when there
// are enough of them to pay for the threads.
#define FOVEA_MAX_PATCH 256  // largest patch side of the CPU loop (checked in Python)
void gather_patches_cpu(const LevelTable* T, int batch, int num_tokens, int img_h, int img_w,
                        int p, const float* centers, const float* lods, const float* steps,
                        float* out, int min_parallel) {
    const int tokens = batch * num_tokens;
    const int pp = p * p, c = T->channels;
#pragma omp parallel for schedule(static) if (tokens >= min_parallel)
    for (int t = 0; t < tokens; ++t) {
        const int b = t / num_tokens;
        const TokenConst tc = token_const(centers[2 * t], centers[2 * t + 1], lods[t], steps[t],
                                          img_h, img_w, T->num_levels);
        float* o = out + (long long)t * c * pp;
        Tap tx[FOVEA_MAX_PATCH], ty[FOVEA_MAX_PATCH];
        for (int q = 0; q < tc.nq; ++q) {
            const int m = tc.lo + q;
            const float inv_s = 1.0f / (float)(1 << m);
            for (int k = 0; k < p; ++k) {
                tx[k] = axis_tap(index_coord(sample_base_pos(tc.cx_px, k, p, tc.step), inv_s),
                                 T->w[m]);
                ty[k] = axis_tap(index_coord(sample_base_pos(tc.cy_px, k, p, tc.step), inv_s),
                                 T->h[m]);
            }
            const float* img = level_image(*T, m, b);
            const int sc = T->sc[m], sy = T->sy[m], sx = T->sx[m];
            const float wq = q == 0 ? 1.0f - tc.frac : tc.frac;
            for (int i = 0; i < p; ++i)
                for (int j = 0; j < p; ++j)
                    for (int ch = 0; ch < c; ++ch) {
                        float* dst = o + ch * pp + i * p + j;
                        const float v = bilerp(img, sc, sy, sx, ty[i], tx[j], ch) * wq;
                        *dst = q == 0 ? v : *dst + v;
                    }
        }
    }
}

// The fused gather's CPU twin (parity only: the same gather_token_quad per token and quad).
void gather_tokens_cpu(const LevelTable* T, int batch, int num_tokens, int img_h, int img_w,
                       int p, int merge, int channels, int temporal, int bf16,
                       const float* centers, const float* lods, const float* steps, void* out,
                       int min_parallel) {
    const int qs = p / merge;
    const int tokens = batch * num_tokens, qpt = merge * merge * ((qs * qs + 3) / 4);
    const long long token_bytes = (long long)channels * temporal * p * p * (bf16 ? 2 : 4);
#pragma omp parallel for schedule(static) if (tokens >= min_parallel)
    for (int t = 0; t < tokens; ++t) {
        const TokenConst tc = token_const(centers[2 * t], centers[2 * t + 1], lods[t], steps[t],
                                          img_h, img_w, T->num_levels);
        for (int quad = 0; quad < qpt; ++quad)
            gather_token_quad(*T, tc, t / num_tokens, p, merge, quad, channels, temporal, bf16,
                              (char*)out + (long long)t * token_bytes);
    }
}

// fovea_core.sample.render's painter, the same float operations in the same order (so the
// same pixels): every token's footprint [X - f/2, X + f/2) (f = p 2^l base px) covers the
// output pixels whose centres fall inside it; a pixel shows the covering token with the
// smallest key (finest level, then lowest index: key = round(256 level) 2^20 + n, the
// torch code's priority) and, of it, the sample under the pixel centre. Two passes per
// image: a z-buffer of keys over every (token, covered pixel), then one write per pixel.
// `out` [B, C, Ho, Wo] holds the background already; `zbuf` is scratch [Ho * Wo].
void render_cpu(int batch, int n, int c, int p, int img_h, int img_w, int ho, int wo,
                float sx, float sy, const float* centers, const float* levels,
                const float* steps, const float* patches, float* out, long long* zbuf) {
    const long long none = 0x7fffffffffffffffLL;
    for (int b = 0; b < batch; ++b) {
        for (long long k = 0; k < (long long)ho * wo; ++k) zbuf[k] = none;
        for (int t = 0; t < n; ++t) {
            const long long e = (long long)b * n + t;
            const float step = steps[e];
            const float half = ((float)p * step) / 2.0f;
            const float cx = centers[2 * e] * (float)img_w, cy = centers[2 * e + 1] * (float)img_h;
            const float x0 = cx - half, y0 = cy - half;
            float fj0 = ceilf(x0 * sx - 0.5f), fj1 = ceilf((cx + half) * sx - 0.5f);
            float fi0 = ceilf(y0 * sy - 0.5f), fi1 = ceilf((cy + half) * sy - 0.5f);
            fj0 = fminf(fmaxf(fj0, 0.0f), (float)wo); fj1 = fminf(fmaxf(fj1, 0.0f), (float)wo);
            fi0 = fminf(fmaxf(fi0, 0.0f), (float)ho); fi1 = fminf(fmaxf(fi1, 0.0f), (float)ho);
            const int j0 = (int)fj0, j1 = (int)fj1, i0 = (int)fi0, i1 = (int)fi1;
            const long long key = (long long)nearbyintf(levels[e] * 256.0f) * (1LL << 20) + t;
            for (int i = i0; i < i1; ++i) {
                long long* row = zbuf + (long long)i * wo;
                for (int j = j0; j < j1; ++j)
                    if (key < row[j]) row[j] = key;
            }
        }
        for (int i = 0; i < ho; ++i)
            for (int j = 0; j < wo; ++j) {
                const long long key = zbuf[(long long)i * wo + j];
                if (key == none) continue;
                const int t = (int)(key & ((1LL << 20) - 1));
                const long long e = (long long)b * n + t;
                const float step = steps[e];
                const float half = ((float)p * step) / 2.0f;
                const float x0 = centers[2 * e] * (float)img_w - half;
                const float y0 = centers[2 * e + 1] * (float)img_h - half;
                long long kx = (long long)floorf((((float)j + 0.5f) / sx - x0) / step);
                long long ky = (long long)floorf((((float)i + 0.5f) / sy - y0) / step);
                kx = kx < 0 ? 0 : (kx > p - 1 ? p - 1 : kx);
                ky = ky < 0 ? 0 : (ky > p - 1 ? p - 1 : ky);
                const float* src = patches + e * c * p * p + ky * p + kx;
                float* dst = out + (long long)b * c * ho * wo + (long long)i * wo + j;
                for (int ch = 0; ch < c; ++ch)
                    dst[(long long)ch * ho * wo] = src[(long long)ch * p * p];
            }
    }
}

// DivPrune's greedy max-min selection (fovea_core.allocators.peers.divprune) for a batch:
// features laid out [B, D, M] (unit vectors, dimension-major so the distance pass runs
// along M in SIMD lanes), first[b] the seed patch. Step t adds the patch whose minimum
// cosine distance 1 - <f_i, f_cur> to the chosen set is largest (ties: lower index), with
// chosen patches held at -inf. Per image the features (D x M floats) stay in cache for
// all n - 1 steps; images run in parallel (OpenMP) when the batch is large enough.
void divprune_cpu(int batch, int m, int d, int n, const float* ft, const long long* first,
                  long long* chosen, float* scratch) {
#pragma omp parallel for schedule(dynamic, 1) if (batch >= 4)
    for (int b = 0; b < batch; ++b) {
        const float* F = ft + (long long)b * d * m;
        float* mind = scratch + (long long)b * 2 * m;
        float* dot = mind + m;
        for (int i = 0; i < m; ++i) mind[i] = INFINITY;
        long long cur = first[b];
        chosen[(long long)b * n] = cur;
        for (int t = 1; t < n; ++t) {
            const float c0 = F[cur];
            for (int i = 0; i < m; ++i) dot[i] = F[i] * c0;
            for (int k = 1; k < d; ++k) {
                const float ck = F[(long long)k * m + cur];
                const float* row = F + (long long)k * m;
                for (int i = 0; i < m; ++i) dot[i] = dot[i] + row[i] * ck;
            }
            for (int i = 0; i < m; ++i) {
                const float dist = 1.0f - dot[i];
                mind[i] = dist < mind[i] ? dist : mind[i];
            }
            mind[cur] = -INFINITY;
            float best = -INFINITY;                       // the largest value (SIMD), then
#pragma omp simd reduction(max : best)                    // its first index (no NaN here)
            for (int i = 0; i < m; ++i) best = mind[i] > best ? mind[i] : best;
            long long arg = 0;
            while (mind[arg] != best) ++arg;
            cur = arg;
            chosen[(long long)b * n + t] = cur;
        }
    }
}

void pyr_down_cpu(const LevelTable* S, int src, const LevelTable* D, int dst, int batch) {
    const int ho = D->h[dst], wo = D->w[dst];
#pragma omp parallel for schedule(static) if ((long long)batch * ho * wo >= (1 << 18))
    for (int row = 0; row < batch * ho; ++row) {
        const int b = row / ho, oy = row - b * ho;
        const float* in = level_image(*S, src, b);
        float* o = (float*)level_image(*D, dst, b) + oy * D->sy[dst];
        for (int ox = 0; ox < wo; ++ox)
            for (int ch = 0; ch < S->channels; ++ch)
                o[ox * D->sx[dst] + ch * D->sc[dst]] = pyr_down_element(
                    in + ch * S->sc[src], S->h[src], S->w[src], S->sy[src], S->sx[src], oy, ox);
    }
}

void remap_lut_cpu(const float* image, long long sb, int sc, int sy, int sx, int batch, int c,
                   int h, int w, const float* lut, int lut_batch, int ho, int wo, float* out) {
    const int per_image = ho * wo;
#pragma omp parallel for schedule(static) if ((long long)batch * per_image >= (1 << 18))
    for (int e = 0; e < batch * per_image; ++e) {
        const int b = e / per_image, pix = e - b * per_image;
        const float* L = lut + 2 * ((long long)(lut_batch == 1 ? 0 : b) * per_image + pix);
        const RemapTaps r = remap_taps(h, w, sy, sx, L[0], L[1]);
        const float* img = image + (long long)b * sb;
        float* o = out + (long long)b * c * per_image + pix;
        for (int ch = 0; ch < c; ++ch)
            o[(long long)ch * per_image] = remap_apply(img + ch * sc, r);
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
