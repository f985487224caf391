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
#include <vector>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

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

// ------------------------------------------------------------------------ one-pass sampling
// sample_image_onepass_cpu: image -> the tokens' patches in one call (issue 22). It streams
// over the rows of the base image once: each row's horizontal blur is computed ONCE into a
// 5-row ring, each output row of level 1 is the vertical combination of 5 ring rows, and
// every new row of level m (m >= 1) feeds level m + 1 at once, while it is still in cache.
// Only the levels the tokens read are built (num_levels). Then every token is gathered with
// gather_patches_cpu's arithmetic.
//
// The pyramid equals cv2.pyrDown (float32) bit for bit, not pyr_down_element: OpenCV's row
// and column blurs each come in a SIMD form (its 128-bit universal intrinsics, the baseline
// build) and a scalar form that associate the same five terms differently, and which form an
// element gets depends on its place in the row (cvpd_row_simd_end, cvpd_col_simd_end). These
// helpers reproduce both forms and the split; tests/test_kernels_onepass.py checks them
// against cv2.pyrDown on odd sizes and 1-4 channels.
#define FOVEA_AI static inline __attribute__((always_inline))

// row blur of taps t0..t4 (= source pixels 2x-2 .. 2x+2), scalar and SIMD association
FOVEA_AI float cvpd_row_scalar(float t0, float t1, float t2, float t3, float t4) {
    return ((t2 * 6.0f + (t1 + t3) * 4.0f) + t0) + t4;
}
FOVEA_AI float cvpd_row_simd(float t0, float t1, float t2, float t3, float t4) {
    return t2 * 6.0f + ((t1 + t3) * 4.0f + (t0 + t4));
}
// column blur of row-blurred rows r0..r4 (= rows 2y-2 .. 2y+2), then the 1/256 scale
FOVEA_AI float cvpd_col_scalar(float r0, float r1, float r2, float r3, float r4) {
    return (((r2 * 6.0f + (r1 + r3) * 4.0f) + r0) + r4) * 0.00390625f;
}
FOVEA_AI float cvpd_col_simd(float r0, float r1, float r2, float r3, float r4) {
    return (((r1 + r3) + r2) * 4.0f + ((r0 + r4) + (r2 + r2))) * 0.00390625f;
}

// Output pixels [1, end) of a row take the SIMD row form: OpenCV runs its vector loop from
// pixel 1 over the pixels that need no right border (width0 of them in all), in steps of
// `step` elements while `need` elements are left (4 float lanes; per channel count).
static inline int cvpd_row_simd_end(int c, int width0) {
    const int need = c == 2 ? 8 : 4, step = c == 2 ? 8 : (c == 3 ? 3 : 4);
    const int left = c * width0 - c;
    const int iters = left >= need ? (left - need) / step + 1 : 0;
    return 1 + iters * step / c;
}
// Elements [0, end) of an output row (wd * c of them) take the SIMD column form.
static inline int cvpd_col_simd_end(int n) { return n / 4 * 4; }

// One pyramid step, level m (src, hs x ws) -> level m + 1 (dst, hd x wd), channels last,
// rows contiguous. ring: 5 row-blurred source rows (slot (sy + 2) % 5 holds source row sy,
// sy from -2 on, reflected); ev / od: even / odd source pixels of one row.
struct PdStep {
    const float* src;
    float* dst;
    float *ring, *ev, *od;
    int hs, ws, hd, wd, width0, row_simd_end, next_sy, rows_done;
    int rstride;  // floats between ring rows (wd * C rounded up to 16: 64-byte aligned)
};

// The SIMD-form row blur of 3-channel rows straight from the source row (AVX-512). Output
// element e = 3x + ch reads source elements 2e - e%3 + 3k, k = -2..2: per 16 outputs one
// two-register permute gathers the even source pixels (taps 0, 2, 4: the same vector shifted
// by one pixel, valignd) and one the odd ones (taps 1, 3). Elements of pixel 0 come out
// wrong (no left neighbour): the caller rewrites them with the scalar form.
#if defined(__AVX512F__)
static inline __m512i cvpd_idx3_make(int r) {         // window offsets of 16 outputs from
    int t[16];                                          // element i0 with i0 % 3 = r
    for (int q = 0; q < 16; ++q) t[q] = 2 * q - (r + q) % 3 + r;
    return _mm512_loadu_si512(t);
}
struct CvpdIdx3 {
    __m512i x[3];
    CvpdIdx3() { for (int r = 0; r < 3; ++r) x[r] = cvpd_idx3_make(r); }
};
static inline __m512i cvpd_idx3(int r) {              // built once, not per row
    static const CvpdIdx3 tab;
    return tab.x[r];
}
static inline __m512 cvpd_pix3(const float* p, __m512i idx) {   // 16 elements from window p
    return _mm512_permutex2var_ps(_mm512_loadu_ps(p), idx, _mm512_loadu_ps(p + 16));
}
static inline __m512 cvpd_blur3(__m512 ev_prev, __m512 ev, __m512 ev_next, __m512 od_prev,
                                __m512 od) {
    const __m512 t0 = _mm512_castsi512_ps(_mm512_alignr_epi32(
        _mm512_castps_si512(ev), _mm512_castps_si512(ev_prev), 13));
    const __m512 t1 = _mm512_castsi512_ps(_mm512_alignr_epi32(
        _mm512_castps_si512(od), _mm512_castps_si512(od_prev), 13));
    const __m512 t4 = _mm512_castsi512_ps(_mm512_alignr_epi32(
        _mm512_castps_si512(ev_next), _mm512_castps_si512(ev), 3));
    // t2 * 6 + ((t1 + t3) * 4 + (t0 + t4)): cvpd_row_simd, lane by lane
    return _mm512_add_ps(_mm512_mul_ps(ev, _mm512_set1_ps(6.0f)),
                         _mm512_add_ps(_mm512_mul_ps(_mm512_add_ps(t1, od), _mm512_set1_ps(4.0f)),
                                       _mm512_add_ps(t0, t4)));
}
// (((r1 + r3) + r2) * 4 + ((r0 + r4) + (r2 + r2))) / 256: cvpd_col_simd, lane by lane
static inline __m512 cvpd_col16(__m512 r0, __m512 r1, __m512 r2, __m512 r3, __m512 r4) {
    return _mm512_mul_ps(
        _mm512_add_ps(_mm512_mul_ps(_mm512_add_ps(_mm512_add_ps(r1, r3), r2),
                                    _mm512_set1_ps(4.0f)),
                      _mm512_add_ps(_mm512_add_ps(r0, r4), _mm512_add_ps(r2, r2))),
        _mm512_set1_ps(0.00390625f));
}
#endif

// Elements [0, i) of the row blur, 48 (16 pixels) a step, for the largest multiple i of 48
// <= end whose loads stay in the row (row_len floats); returns i (0 without AVX-512).
// Vector v = 0, 1, 2 of a step starts at element 48 J + 16 v, its window at 96 J + 31 v.
// On the way it prefetches row pf (if any; the source row 8 below): the image streams in
// from memory ahead of the blur instead of stalling it.
static inline int cvpd_row3_main(const float* s, int row_len, float* row, int end,
                                 const float* pf) {
    int i = 0;
#if defined(__AVX512F__)
    const __m512i x0 = cvpd_idx3(0), x1 = cvpd_idx3(1), x2 = cvpd_idx3(2);
    __m512 ev_prev = _mm512_setzero_ps(), od_prev = _mm512_setzero_ps();
    __m512 ev0 = row_len >= 32 ? cvpd_pix3(s, x0) : _mm512_setzero_ps();
    // step J reads up to s[96 J + 96 + 31] (the next step's first even vector)
    for (; i + 48 <= end && 2 * i + 96 + 32 <= row_len; i += 48) {
        const float* p = s + 2 * i;
        if (pf)                                        // the row 8 below, towards L2
            for (int k = 0; k < 96; k += 16) __builtin_prefetch(pf + 2 * i + k, 0, 2);
        const __m512 ev1 = cvpd_pix3(p + 31, x1), ev2 = cvpd_pix3(p + 62, x2);
        const __m512 ev3 = cvpd_pix3(p + 96, x0);
        const __m512 od0 = cvpd_pix3(p + 3, x0), od1 = cvpd_pix3(p + 34, x1);
        const __m512 od2 = cvpd_pix3(p + 65, x2);
        _mm512_storeu_ps(row + i, cvpd_blur3(ev_prev, ev0, ev1, od_prev, od0));
        _mm512_storeu_ps(row + i + 16, cvpd_blur3(ev0, ev1, ev2, od0, od1));
        _mm512_storeu_ps(row + i + 32, cvpd_blur3(ev1, ev2, ev3, od1, od2));
        ev_prev = ev2; ev0 = ev3; od_prev = od2;
    }
#else
    (void)s; (void)row_len; (void)row; (void)end; (void)pf;
#endif
    return i;
}

// cvpd_row3_main for two source rows sa, sb at once (into ring rows ra, rb), and with the
// ring rows q0, q1, q2 of source rows 2y-2 .. 2y (sa, sb: 2y+1, 2y+2) the SIMD-form column
// blur of the same elements into output row d: one pass over the columns instead of three.
// Prefetches rows pf and pf + row_len. Returns i as cvpd_row3_main.
static inline int cvpd_rows2_col3_main(const float* sa, const float* sb, int row_len, float* ra,
                                       float* rb, const float* q0, const float* q1,
                                       const float* q2, float* d, int end, const float* pf) {
    int i = 0;
#if defined(__AVX512F__)
    const __m512i x0 = cvpd_idx3(0), x1 = cvpd_idx3(1), x2 = cvpd_idx3(2);
    __m512 ea_prev = _mm512_setzero_ps(), oa_prev = _mm512_setzero_ps();
    __m512 eb_prev = _mm512_setzero_ps(), ob_prev = _mm512_setzero_ps();
    __m512 ea0 = row_len >= 32 ? cvpd_pix3(sa, x0) : _mm512_setzero_ps();
    __m512 eb0 = row_len >= 32 ? cvpd_pix3(sb, x0) : _mm512_setzero_ps();
    for (; i + 48 <= end && 2 * i + 96 + 32 <= row_len; i += 48) {
        const float* pa = sa + 2 * i;
        const float* pb = sb + 2 * i;
        if (pf)                                        // rows 8 and 9 below, towards L2
            for (int k = 0; k < 96; k += 16) {
                __builtin_prefetch(pf + 2 * i + k, 0, 2);
                __builtin_prefetch(pf + row_len + 2 * i + k, 0, 2);
            }
        const __m512 ea1 = cvpd_pix3(pa + 31, x1), ea2 = cvpd_pix3(pa + 62, x2);
        const __m512 ea3 = cvpd_pix3(pa + 96, x0);
        const __m512 oa0 = cvpd_pix3(pa + 3, x0), oa1 = cvpd_pix3(pa + 34, x1);
        const __m512 oa2 = cvpd_pix3(pa + 65, x2);
        const __m512 eb1 = cvpd_pix3(pb + 31, x1), eb2 = cvpd_pix3(pb + 62, x2);
        const __m512 eb3 = cvpd_pix3(pb + 96, x0);
        const __m512 ob0 = cvpd_pix3(pb + 3, x0), ob1 = cvpd_pix3(pb + 34, x1);
        const __m512 ob2 = cvpd_pix3(pb + 65, x2);
        const __m512 ha[3] = {cvpd_blur3(ea_prev, ea0, ea1, oa_prev, oa0),
                              cvpd_blur3(ea0, ea1, ea2, oa0, oa1),
                              cvpd_blur3(ea1, ea2, ea3, oa1, oa2)};
        const __m512 hb[3] = {cvpd_blur3(eb_prev, eb0, eb1, ob_prev, ob0),
                              cvpd_blur3(eb0, eb1, eb2, ob0, ob1),
                              cvpd_blur3(eb1, eb2, eb3, ob1, ob2)};
        for (int v = 0; v < 3; ++v) {
            const int e = i + 16 * v;
            _mm512_storeu_ps(ra + e, ha[v]);
            _mm512_storeu_ps(rb + e, hb[v]);
            _mm512_storeu_ps(d + e, cvpd_col16(_mm512_loadu_ps(q0 + e), _mm512_loadu_ps(q1 + e),
                                               _mm512_loadu_ps(q2 + e), ha[v], hb[v]));
        }
        ea_prev = ea2; ea0 = ea3; oa_prev = oa2;
        eb_prev = eb2; eb0 = eb3; ob_prev = ob2;
    }
#else
    (void)sa; (void)sb; (void)row_len; (void)ra; (void)rb; (void)q0; (void)q1; (void)q2;
    (void)d; (void)end; (void)pf;
#endif
    return i;
}

// Elements [i, end) of the row blur, 16 at a time (the last 16 overlapping), from masked
// loads: source elements outside the row read as 0 and reach only lanes of pixel 0
// (rewritten by the caller). Returns end (i without AVX-512 or when end < 16).
static inline int cvpd_row3_tail(const float* s, int row_len, float* row, int i, int end) {
#if defined(__AVX512F__)
    if (end < 16 || i >= end) return i;
    const __m512i idx[3] = {cvpd_idx3(0), cvpd_idx3(1), cvpd_idx3(2)};
    auto window = [&](int base) {                      // s[base .. base + 15], in the row
        const int lo = base < 0 ? -base : 0, hi = row_len - base < 16 ? row_len - base : 16;
        const __mmask16 m = (__mmask16)(lo >= hi ? 0 : ((1u << hi) - 1u) & ~((1u << lo) - 1u));
        return _mm512_maskz_loadu_ps(m, s + base);
    };
    auto pix16 = [&](int i0, int odd) {                // even / odd pixels of elements i0..+15
        const int r = ((i0 % 3) + 3) % 3, base = 2 * i0 - r + 3 * odd;
        return _mm512_permutex2var_ps(window(base), idx[r], window(base + 16));
    };
    for (int i0 = i; i0 < end; i0 += 16) {
        const int j = i0 + 16 <= end ? i0 : end - 16;
        _mm512_storeu_ps(row + j, cvpd_blur3(pix16(j - 16, 0), pix16(j, 0), pix16(j + 16, 0),
                                             pix16(j - 16, 1), pix16(j, 1)));
    }
    return end;
#else
    (void)s; (void)row_len; (void)row; (void)end;
    return i;
#endif
}

// Row blur of source row sy into its ring slot; for C = 3, elements [C, from) already hold
// it (cvpd_rows2_col3_main wrote them).
FOVEA_AI void cvpd_row(PdStep& S, int sy, const int C, int from = 0) {
    const float* __restrict__ s = S.src + (long long)reflect101(sy, S.hs) * S.ws * C;
    float* __restrict__ row = S.ring + (long long)((sy + 2) % 5) * S.rstride;
    const int ws = S.ws, he = S.row_simd_end;
    auto scalar_px = [&](int x) {                    // reflect-101 taps, scalar form
        int t[5];
        for (int k = 0; k < 5; ++k) t[k] = reflect101(2 * x - 2 + k, ws) * C;
        for (int ch = 0; ch < C; ++ch)
            row[x * C + ch] = cvpd_row_scalar(s[t[0] + ch], s[t[1] + ch], s[t[2] + ch],
                                              s[t[3] + ch], s[t[4] + ch]);
    };
    if (he > 1) {
        // pixels [1, he) read source pixels [0, 2 he] (no border)
        if (C == 3) {
            const float* pf = sy + 8 < S.hs && sy >= 0 ? S.src + (long long)(sy + 8) * ws * C
                                                       : nullptr;
            int e = from > 0 ? from : cvpd_row3_main(s, ws * C, row, he * C, pf);
            e = cvpd_row3_tail(s, ws * C, row, e, he * C);
            for (e = e > C ? e : C; e < he * C; ++e) {
                const int c0 = 2 * e - e % 3;
                row[e] = cvpd_row_simd(s[c0 - 6], s[c0 - 3], s[c0], s[c0 + 3], s[c0 + 6]);
            }
        } else {
            // split the pixels into even and odd ones so that the five taps of output
            // element e are contiguous in e
            float* __restrict__ ev = S.ev;
            float* __restrict__ od = S.od;
            for (int k = 0; k < he; ++k)
                for (int ch = 0; ch < C; ++ch) {
                    ev[k * C + ch] = s[2 * k * C + ch];
                    od[k * C + ch] = s[(2 * k + 1) * C + ch];
                }
            for (int ch = 0; ch < C; ++ch) ev[he * C + ch] = s[2 * he * C + ch];
            for (int e = C; e < he * C; ++e)
                row[e] = cvpd_row_simd(ev[e - C], od[e - C], ev[e], od[e], ev[e + C]);
        }
    }
    scalar_px(0);
    for (int x = he > 1 ? he : 1; x < S.wd; ++x) scalar_px(x);
}

// Column blur of output row y from the ring (row blurs of source rows 2y-2 .. 2y+2).
FOVEA_AI void cvpd_col(PdStep& S, int y, const int C) {
    const int n = S.wd * C, ve = cvpd_col_simd_end(n);
    const long long rs = S.rstride;
    const float* __restrict__ r0 = S.ring + ((2 * y) % 5) * rs;
    const float* __restrict__ r1 = S.ring + ((2 * y + 1) % 5) * rs;
    const float* __restrict__ r2 = S.ring + ((2 * y + 2) % 5) * rs;
    const float* __restrict__ r3 = S.ring + ((2 * y + 3) % 5) * rs;
    const float* __restrict__ r4 = S.ring + ((2 * y + 4) % 5) * rs;
    float* __restrict__ d = S.dst + (long long)y * n;
    for (int e = 0; e < ve; ++e) d[e] = cvpd_col_simd(r0[e], r1[e], r2[e], r3[e], r4[e]);
    for (int e = ve; e < n; ++e) d[e] = cvpd_col_scalar(r0[e], r1[e], r2[e], r3[e], r4[e]);
}

// Output row y when its last two source rows (2y+1, 2y+2) are still to be blurred and the
// three before are in the ring (y >= 1), C = 3: both row blurs and the column blur in one
// pass over the columns (cvpd_rows2_col3_main), then the border pixels and the tail the same
// way as cvpd_row / cvpd_col. Returns false (nothing done) where that pass does not apply.
FOVEA_AI bool cvpd_rows2_col3(PdStep& S, int y) {
#if defined(__AVX512F__)
    const int C = 3, n = S.wd * C, ve = cvpd_col_simd_end(n), he = S.row_simd_end;
    if (y < 1 || he <= 1 || S.next_sy != 2 * y + 1) return false;
    const long long rs = S.rstride;
    const float* sa = S.src + (long long)reflect101(2 * y + 1, S.hs) * S.ws * C;
    const float* sb = S.src + (long long)reflect101(2 * y + 2, S.hs) * S.ws * C;
    float* ra = S.ring + ((2 * y + 3) % 5) * rs;
    float* rb = S.ring + ((2 * y + 4) % 5) * rs;
    const float* q0 = S.ring + ((2 * y) % 5) * rs;
    const float* q1 = S.ring + ((2 * y + 1) % 5) * rs;
    const float* q2 = S.ring + ((2 * y + 2) % 5) * rs;
    float* d = S.dst + (long long)y * n;
    const float* pf = 2 * y + 10 < S.hs ? S.src + (long long)(2 * y + 9) * S.ws * C : nullptr;
    const int i = cvpd_rows2_col3_main(sa, sb, S.ws * C, ra, rb, q0, q1, q2, d, he * C, pf);
    if (i < 48) return false;                           // nothing fused: the plain way
    cvpd_row(S, 2 * y + 1, C, i);
    cvpd_row(S, 2 * y + 2, C, i);
    S.next_sy = 2 * y + 3;
    auto col = [&](int e) {
        d[e] = e < ve ? cvpd_col_simd(q0[e], q1[e], q2[e], ra[e], rb[e])
                      : cvpd_col_scalar(q0[e], q1[e], q2[e], ra[e], rb[e]);
    };
    for (int e = 0; e < C; ++e) col(e);                 // pixel 0: rewritten row blurs
    for (int e = i; e < n; ++e) col(e);
    return true;
#else
    (void)S; (void)y;
    return false;
#endif
}

// Write output rows while the source rows they read (up to min(2y+2, hs-1)) are among the
// `avail` rows of the source level already written; at most `max_rows` of them.
FOVEA_AI void cvpd_advance(PdStep& S, int avail, int max_rows, const int C) {
    for (int done = 0; done < max_rows && S.rows_done < S.hd; ++done) {
        const int y = S.rows_done;
        const int last = 2 * y + 2 < S.hs - 1 ? 2 * y + 2 : S.hs - 1;
        if (last >= avail) return;
        if (C != 3 || !cvpd_rows2_col3(S, y)) {
            for (; S.next_sy <= 2 * y + 2; ++S.next_sy) cvpd_row(S, S.next_sy, C);
            cvpd_col(S, y, C);
        }
        ++S.rows_done;
    }
}

// Levels 1 .. nl-1 of one image (level 0: img, [h, w, C] contiguous) into lv[1 .. nl-1]:
// level 1 row by row from the image, each deeper level as soon as its source rows exist.
FOVEA_AI void cvpd_pyramid(const float* img, int h, int w, int nl, float* const* lv,
                           float* scratch, const int C) {
    PdStep st[FOVEA_MAX_LEVELS];
    int hs = h, ws = w;
    float* sp = scratch;
    for (int m = 0; m + 1 < nl; ++m) {
        PdStep& S = st[m];
        S.src = m == 0 ? img : lv[m];
        S.dst = lv[m + 1];
        S.hs = hs; S.ws = ws; S.hd = (hs + 1) / 2; S.wd = (ws + 1) / 2;
        const int w0 = (ws - 3) / 2 + 1;               // C division, as OpenCV's
        S.width0 = w0 < S.wd ? w0 : S.wd;
        S.row_simd_end = cvpd_row_simd_end(C, S.width0);
        S.rstride = (S.wd * C + 15) / 16 * 16;
        S.ring = sp; sp += 5LL * S.rstride;
        S.ev = sp; sp += ((long long)(S.wd + 1) * C + 15) & ~15LL;
        S.od = sp; sp += ((long long)(S.wd + 1) * C + 15) & ~15LL;
        S.next_sy = -2; S.rows_done = 0;
        hs = S.hd; ws = S.wd;
    }
    if (nl < 2) return;
    while (st[0].rows_done < st[0].hd) {
        cvpd_advance(st[0], h, 1, C);
        for (int m = 1; m + 1 < nl; ++m) cvpd_advance(st[m], st[m - 1].rows_done, 1 << 30, C);
    }
}

// Scratch floats cvpd_pyramid needs for an image w pixels wide, c channels, nl levels.
static inline long long cvpd_scratch_floats(int w, int c, int nl) {
    long long n = 0;
    for (int m = 0; m + 1 < nl; ++m) {
        w = (w + 1) / 2;
        n += 5LL * ((w * c + 15) / 16 * 16) + 2 * (((long long)(w + 1) * c + 15) & ~15LL);
    }
    return n;
}

// One token of image b from channels-last levels (sx = C, sc = 1): gather_patches_cpu's
// arithmetic (the same taps, the same bilerp branches and operation order, * wq, + for the
// second level), laid out for SIMD: where a token's x taps are one run of consecutive pixels
// with one weight (every token on its level's grid, and most others), a sample row is
// p * C consecutive floats, interpolated as one contiguous vector loop and then
// transposed to the channel-major output; other tokens take the per-sample loop.
#if defined(__AVX512F__)
// Planes of 16 interleaved RGB pixels (3 vectors): plane ch, lane k = element 3k + ch, from
// the first two vectors (lo) for k below the mask, from the third (hi) above it.
struct Rgb16Split {
    __m512i lo[3], hi[3];
    __mmask16 hi_mask[3];
    Rgb16Split() {
        for (int ch = 0; ch < 3; ++ch) {
            int ia[16], ib[16];
            const int kk = (32 - ch + 2) / 3;               // lanes with 3k + ch < 32
            for (int k = 0; k < 16; ++k) {
                ia[k] = k < kk ? 3 * k + ch : 0;
                ib[k] = k < kk ? 0 : 3 * k + ch - 32;
            }
            lo[ch] = _mm512_loadu_si512(ia);
            hi[ch] = _mm512_loadu_si512(ib);
            hi_mask[ch] = (__mmask16)(0xFFFFu << kk);
        }
    }
};
#endif

FOVEA_AI void gather_token_hwc(const LevelTable& T, int b, const TokenConst& tc, int p,
                               float* __restrict__ o, const int C) {
#if defined(__AVX512F__)
    static const Rgb16Split tr;
#endif
    const int pp = p * p, pc = p * C;
    Tap tx[FOVEA_MAX_PATCH], ty[FOVEA_MAX_PATCH];
    float top[FOVEA_MAX_PATCH * 4], bot[FOVEA_MAX_PATCH * 4];
    for (int q = 0; q < tc.nq; ++q) {
        const int m = tc.lo + q;
        const float inv_s = 1.0f / (float)(1 << m);
        for (int k = 0; k < p; ++k) {
            tx[k] = axis_tap(index_coord(sample_base_pos(tc.cx_px, k, p, tc.step), inv_s),
                             T.w[m]);
            ty[k] = axis_tap(index_coord(sample_base_pos(tc.cy_px, k, p, tc.step), inv_s),
                             T.h[m]);
        }
        const float* img = level_image(T, m, b);
        const int sy = T.sy[m];
        const float wq = q == 0 ? 1.0f - tc.frac : tc.frac;
        const float fx = tx[0].f;
        bool run = true;                                 // x taps: one run, one weight
        for (int k = 0; k < p && run; ++k)
            run = tx[k].f == fx && tx[k].i0 == tx[0].i0 + k
                  && (fx == 0.0f || tx[k].i1 == tx[k].i0 + 1);
        if (run) {                                       // ask for every row the token reads
            const int x0 = tx[0].i0 * C;                 // at once (memory-level parallelism)
            for (int i = 0; i < p; ++i) {
                const float* r0 = img + ty[i].i0 * sy + x0;
                const float* r1 = img + ty[i].i1 * sy + x0;
                for (int u = 0; u <= pc; u += 16) {
                    __builtin_prefetch(r0 + u);
                    if (ty[i].f != 0.0f) __builtin_prefetch(r1 + u);
                }
            }
        }
        for (int i = 0; i < p; ++i) {
            const float* r0 = img + ty[i].i0 * sy;
            const float* r1 = img + ty[i].i1 * sy;
            const float fy = ty[i].f;
            if (run) {
                const float* a = r0 + tx[0].i0 * C;
                const float* c = r1 + tx[0].i0 * C;
                if (fx == 0.0f) {
                    for (int u = 0; u < pc; ++u) top[u] = a[u];
                    if (fy != 0.0f)
                        for (int u = 0; u < pc; ++u) top[u] = lerp_exact(top[u], c[u], fy);
                } else {
                    for (int u = 0; u < pc; ++u) top[u] = lerp_exact(a[u], a[u + C], fx);
                    if (fy != 0.0f) {
                        for (int u = 0; u < pc; ++u) bot[u] = lerp_exact(c[u], c[u + C], fx);
                        for (int u = 0; u < pc; ++u) top[u] = lerp_exact(top[u], bot[u], fy);
                    }
                }
                float* oi = o + i * p;
#if defined(__AVX512F__)
                if (C == 3 && p % 16 == 0) {             // 16 pixels = 48 floats -> 3 planes
                    const __m512 vw = _mm512_set1_ps(wq);
                    for (int j = 0; j < p; j += 16) {
                        const __m512 v0 = _mm512_loadu_ps(top + 3 * j);
                        const __m512 v1 = _mm512_loadu_ps(top + 3 * j + 16);
                        const __m512 v2 = _mm512_loadu_ps(top + 3 * j + 32);
                        for (int ch = 0; ch < 3; ++ch) {
                            __m512 pl = _mm512_permutex2var_ps(v0, tr.lo[ch], v1);
                            pl = _mm512_mask_permutexvar_ps(pl, tr.hi_mask[ch], tr.hi[ch], v2);
                            float* dst = oi + ch * pp + j;
                            const __m512 v = _mm512_mul_ps(pl, vw);
                            _mm512_storeu_ps(dst, q == 0 ? v
                                                         : _mm512_add_ps(_mm512_loadu_ps(dst), v));
                        }
                    }
                    continue;
                }
#endif
                if (q == 0) {
                    for (int j = 0; j < p; ++j)
                        for (int ch = 0; ch < C; ++ch) oi[ch * pp + j] = top[j * C + ch] * wq;
                } else {
                    for (int j = 0; j < p; ++j)
                        for (int ch = 0; ch < C; ++ch)
                            oi[ch * pp + j] = oi[ch * pp + j] + top[j * C + ch] * wq;
                }
            } else {
                for (int j = 0; j < p; ++j)
                    for (int ch = 0; ch < C; ++ch) {
                        float* dst = o + ch * pp + i * p + j;
                        const float v = bilerp(img, 1, sy, C, ty[i], tx[j], ch) * wq;
                        *dst = q == 0 ? v : *dst + v;
                    }
            }
        }
    }
}

// Tokens [t0, t1) of image b (flat token index t = b * N + n). Inlined into its one caller,
// which builds T: g++ 12.2's IPA mod/ref analysis dropped the caller's stores to T.ptr / T.sb
// when this was a separate static function called with a freshly built table (seen in a
// stand-alone driver, gone with -fno-ipa-modref), so no call boundary is left for it.
FOVEA_AI void gather_tokens_hwc(const LevelTable& T, int b, int t0, int t1, int img_h, int img_w,
                              int p, const float* centers, const float* lods, const float* steps,
                              float* out, int min_parallel) {
    const int c = T.channels;
#pragma omp parallel for schedule(static) if (t1 - t0 >= min_parallel)
    for (int t = t0; t < t1; ++t) {
        const TokenConst tc = token_const(centers[2 * t], centers[2 * t + 1], lods[t], steps[t],
                                          img_h, img_w, T.num_levels);
        float* o = out + (long long)t * c * p * p;
        switch (c) {
            case 1: gather_token_hwc(T, b, tc, p, o, 1); break;
            case 2: gather_token_hwc(T, b, tc, p, o, 2); break;
            case 3: gather_token_hwc(T, b, tc, p, o, 3); break;
            default: gather_token_hwc(T, b, tc, p, o, 4); break;
        }
    }
}

// image [B, H, W, C] float32 contiguous (C in 1..4) -> patches [B * N, C, p, p] of the tokens,
// building levels_needed(tokens, max_levels) = min(ceil(max lods) + 1, max_levels) levels
// (max_levels of them when there are no tokens), levels 1.. written to `work` as
// fovea_book.kernels' _layout(first=1) packs them (level m: [B, H_m, W_m, C];
// `work` must hold max_levels of them). Image by image, the levels are built and at once the
// image's tokens gathered from them, while they are in cache (tokens on OpenMP threads from
// min_parallel tokens an image). steps: 2^lods as torch.exp2 gives them; NULL: computed here
// where every level is an integer (2^k, exact in both), else -3 is returned at once (nothing
// done) for the caller to pass torch.exp2's. Returns the number of levels built (>= 1), -1
// for a channel count outside 1..4, max_levels outside 1..FOVEA_MAX_LEVELS or p outside
// 1..FOVEA_MAX_PATCH, -2 for a token level beyond the levels (nothing done).
int sample_image_onepass_cpu(const float* image, int batch, int h, int w, int c, int max_levels,
                             float* work, int p, int num_tokens, const float* centers,
                             const float* lods, const float* steps, float* out,
                             int min_parallel) {
    if (c < 1 || c > 4 || max_levels < 1 || max_levels > FOVEA_MAX_LEVELS || p < 1
        || p > FOVEA_MAX_PATCH)
        return -1;
    const long long tokens = (long long)batch * num_tokens;
    int num_levels = max_levels;
    if (tokens > 0) {
        float lmax = lods[0];
        bool whole = true;
        for (long long t = 0; t < tokens; ++t) {
            lmax = lods[t] > lmax ? lods[t] : lmax;
            whole = whole && lods[t] == floorf(lods[t]);
        }
        const float need = ceilf(lmax) + 1.0f;
        num_levels = need < (float)max_levels ? (int)need : max_levels;
        if (lmax > (float)(num_levels - 1)) return -2;
        if (!steps && !whole) return -3;
    }
    static thread_local std::vector<float> own_steps;
    if (!steps && tokens > 0) {                          // integer levels: 2^k exactly
        if ((long long)own_steps.size() < tokens) own_steps.resize((size_t)tokens);
        for (long long t = 0; t < tokens; ++t) own_steps[t] = ldexpf(1.0f, (int)lods[t]);
        steps = own_steps.data();
    }
    LevelTable T;
    int hm = h, wm = w;
    long long off = 0;
    for (int m = 0; m < num_levels; ++m) {
        T.ptr[m] = m == 0 ? (long long)image : (long long)(work + off);
        T.sb[m] = (long long)hm * wm * c;
        T.h[m] = hm; T.w[m] = wm; T.sc[m] = 1; T.sy[m] = wm * c; T.sx[m] = c;
        if (m > 0) off += (long long)batch * hm * wm * c;
        hm = (hm + 1) / 2; wm = (wm + 1) / 2;
    }
    T.num_levels = num_levels; T.channels = c;
    static thread_local std::vector<float> buf;         // grown, never shrunk: no page faults
    const size_t need = (size_t)cvpd_scratch_floats(w, c, num_levels) + 16;
    if (buf.size() < need) buf.resize(need);
    float* scratch = buf.data() + ((16 - ((size_t)buf.data() / 4) % 16) % 16);  // 64-byte aligned
    for (int b = 0; b < batch; ++b) {
        float* lv[FOVEA_MAX_LEVELS];
        for (int m = 1; m < num_levels; ++m) lv[m] = (float*)T.ptr[m] + (long long)b * T.sb[m];
        const float* img = image + (long long)b * T.sb[0];
        switch (c) {
            case 1: cvpd_pyramid(img, h, w, num_levels, lv, scratch, 1); break;
            case 2: cvpd_pyramid(img, h, w, num_levels, lv, scratch, 2); break;
            case 3: cvpd_pyramid(img, h, w, num_levels, lv, scratch, 3); break;
            default: cvpd_pyramid(img, h, w, num_levels, lv, scratch, 4); break;
        }
        gather_tokens_hwc(T, b, b * num_tokens, (b + 1) * num_tokens, h, w, p, centers, lods,
                          steps, out, min_parallel);
    }
    return num_levels;
}

}  // extern "C"
#endif
