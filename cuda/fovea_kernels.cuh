// fovea_kernels.cuh -- the per-element math of every foveated kernel, written once.
//
// Every function here is HD: `__host__ __device__` under nvcc, a plain `static inline`
// C++ function under g++. fovea_kernels.cu wraps them (a) in `__global__` CUDA kernels and
// (b) in `extern "C"` CPU loops for the g++ build that fovea_core.kernels calls through
// ctypes. The torch references in fovea_core/sample.py, fovea_core/pyramid.py and
// fovea_core/allocators/cortical.py implement the same formulas with the same operations in
// the same order; tests/test_kernels.py checks the builds against them.
//
// Floating point: both builds round every + - * / separately, as torch's elementwise ops
// do (g++ -ffp-contract=off, nvcc -fmad=false); nothing is fused into an FMA, so the
// bilinear gather equals the torch reference bit for bit.
//
// Indexing: 32-bit inside one image of one level (a level image has < 2^31 elements);
// 64-bit only for the start of an image (b * batch stride) and of a token's output block,
// computed once per token.
//
// Coordinates (see fovea_core/sample.py): base pixel i spans [i, i+1); a continuous base
// coordinate X sits at index coordinate X / 2^m - 0.5 of mip level m (pixel centres at
// integers, the OpenCV convention).
#pragma once

#ifdef __CUDACC__
#define HD __host__ __device__ __forceinline__
#else
#include <math.h>
#define HD static inline
#endif

#define FOVEA_MAX_LEVELS 16

// Fully unroll a loop of constant trip count (so small arrays stay in registers on the GPU).
#ifdef __CUDACC__
#define FOVEA_UNROLL _Pragma("unroll")
#else
#define FOVEA_UNROLL _Pragma("GCC unroll 4")
#endif

// ---------------------------------------------------------------------------------------
// Where the levels of a pyramid live. Level m is a [B, C, H_m, W_m] array of floats at
// address ptr[m] with element strides (sb, sc, sy, sx): the same table describes a torch
// Pyramid whose levels are views of one packed NCHW buffer (fovea_core.pyramid), a
// channels-last (HWC) buffer written by cv2.pyrDown, or level 0 taken straight from the
// caller's image. Passed BY VALUE to every kernel (no device-side table, no copy).
// ---------------------------------------------------------------------------------------
struct LevelTable {
    long long ptr[FOVEA_MAX_LEVELS];  // address of element (0, 0, 0, 0) of level m
    long long sb[FOVEA_MAX_LEVELS];   // batch stride (elements)
    int h[FOVEA_MAX_LEVELS], w[FOVEA_MAX_LEVELS];
    int sc[FOVEA_MAX_LEVELS], sy[FOVEA_MAX_LEVELS], sx[FOVEA_MAX_LEVELS];
    int num_levels, channels;
};

HD const float* level_image(const LevelTable& T, int m, int b) {
    return (const float*)T.ptr[m] + (long long)b * T.sb[m];
}

// ---------------------------------------------------------------------------------------
// Patch gather
// ---------------------------------------------------------------------------------------
// One axis of a clamp-to-edge bilinear read: index coordinate -> two taps and a weight.
struct Tap { int i0, i1; float f; };
HD Tap axis_tap(float pos, int n) {
    pos = fminf(fmaxf(pos, 0.0f), (float)(n - 1));         // clamp-to-edge (replicate)
    const float f0 = floorf(pos);
    Tap t;
    t.i0 = (int)f0;
    t.i1 = t.i0 + 1 < n ? t.i0 + 1 : n - 1;
    t.f = pos - f0;                                          // exact: the fractional part
    return t;
}

// Base-pixel position of sample k (0 <= k < p) of a token whose centre is at base
// coordinate c_px (= normalised centre * image side), sample spacing `step` = 2^lod base
// pixels: c_px + (k - (p - 1) / 2) * step.
HD float sample_base_pos(float c_px, int k, int p, float step) {
    return c_px + ((float)k - 0.5f * (float)(p - 1)) * step;
}

// ... as an index coordinate of mip level m (inv_s = 2^-m, exact): X / 2^m - 0.5.
HD float index_coord(float base_pos, float inv_s) { return base_pos * inv_s - 0.5f; }

// Constants of one token, computed once per token (not per sample or channel).
struct TokenConst {
    float cx_px, cy_px;   // centre in base pixels
    float step;           // 2^lod (computed by the caller, torch.exp2: both builds agree)
    int lo;               // first level read, floor(lod) clipped to the pyramid
    float frac;           // weight of level lo + 1 (0: plain bilinear)
    int nq;               // levels read: 1, or 2 when frac > 0 (trilinear)
};
HD TokenConst token_const(float cx, float cy, float lod, float step, int img_h, int img_w,
                          int num_levels) {
    TokenConst t;
    t.cx_px = cx * (float)img_w;
    t.cy_px = cy * (float)img_h;
    t.step = step;
    int lo = (int)floorf(lod);
    if (lo > num_levels - 1) lo = num_levels - 1;
    t.lo = lo;
    t.frac = lod - (float)lo;
    t.nq = (t.frac > 0.0f && lo + 1 < num_levels) ? 2 : 1;
    return t;
}

// Interpolate two values with weight f of the second: a (1 - f) + b f. When f == 0 the
// result is exactly a (a * 1 + b * 0 = a), so the second tap is not read at all: a token on
// its level's pixel grid costs one read per sample and channel, not four.
HD float lerp_exact(float a, float b, float f) { return a * (1.0f - f) + b * f; }

// Bilinear value of channel ch at taps (ty, tx) of one level image.
HD float bilerp(const float* img, int sc, int sy, int sx, Tap ty, Tap tx, int ch) {
    const float* r0 = img + ch * sc + ty.i0 * sy;
    const float a = r0[tx.i0 * sx];
    const float top = tx.f == 0.0f ? a : lerp_exact(a, r0[tx.i1 * sx], tx.f);
    if (ty.f == 0.0f) return top;
    const float* r1 = img + ch * sc + ty.i1 * sy;
    const float c = r1[tx.i0 * sx];
    const float bot = tx.f == 0.0f ? c : lerp_exact(c, r1[tx.i1 * sx], tx.f);
    return lerp_exact(top, bot, ty.f);
}

// All channels of sample (i, j) of one token: out[ch * p * p] for ch < C.
HD void gather_sample(const LevelTable& T, const TokenConst& t, int b, int p, int i, int j,
                      float* out, int out_stride) {
    const int c = T.channels;
    for (int q = 0; q < t.nq; ++q) {
        const int m = t.lo + q;
        const float inv_s = 1.0f / (float)(1 << m);          // exact power of two
        const Tap tx = axis_tap(index_coord(sample_base_pos(t.cx_px, j, p, t.step), inv_s),
                                T.w[m]);
        const Tap ty = axis_tap(index_coord(sample_base_pos(t.cy_px, i, p, t.step), inv_s),
                                T.h[m]);
        const float* img = level_image(T, m, b);
        const float wq = q == 0 ? 1.0f - t.frac : t.frac;
        for (int ch = 0; ch < c; ++ch) {
            const float v = bilerp(img, T.sc[m], T.sy[m], T.sx[m], ty, tx, ch) * wq;
            out[ch * out_stride] = q == 0 ? v : out[ch * out_stride] + v;
        }
    }
}

// ---------------------------------------------------------------------------------------
// Fused token gather (gather_tokens): channels-last pyramids whose channel count is a
// multiple of 4 ("NHWC4", e.g. RGB + one zero channel), so one tap of four channels is one
// 128-bit load; a thread computes four consecutive samples of a token ("a quad") and writes
// them as one 128-bit store per output channel. Every lane does the scalar arithmetic of
// gather_sample / bilerp in the same order, so the values are the same bits.
// ---------------------------------------------------------------------------------------
struct F4 { float v[4]; };

// Four consecutive floats at p (16-byte aligned on the GPU: the caller checks).
HD F4 load4(const float* p) {
    F4 r;
#ifdef __CUDA_ARCH__
    const float4 q = __ldg(reinterpret_cast<const float4*>(p));
    r.v[0] = q.x; r.v[1] = q.y; r.v[2] = q.z; r.v[3] = q.w;
#else
    for (int k = 0; k < 4; ++k) r.v[k] = p[k];
#endif
    return r;
}

// One row of a bilinear read, four adjacent channels: the x taps blended (the first alone when
// the fraction is zero, as in bilerp).
HD F4 row_lerp4(const float* row, int sx, Tap tx) {
    F4 r = load4(row + tx.i0 * sx);
    if (tx.f != 0.0f) {
        const F4 b = load4(row + tx.i1 * sx);
        FOVEA_UNROLL
        for (int k = 0; k < 4; ++k) r.v[k] = lerp_exact(r.v[k], b.v[k], tx.f);
    }
    return r;
}

// bilerp of four adjacent channels (px points at channel 4g of the level image).
HD F4 bilerp4(const float* px, int sy, int sx, Tap ty, Tap tx) {
    const F4 top = row_lerp4(px + ty.i0 * sy, sx, tx);
    if (ty.f == 0.0f) return top;
    const F4 bot = row_lerp4(px + ty.i1 * sy, sx, tx);
    F4 r;
    FOVEA_UNROLL
    for (int k = 0; k < 4; ++k) r.v[k] = lerp_exact(top.v[k], bot.v[k], ty.f);
    return r;
}

// Channels 4g..4g+3 of samples s0..s0+nk-1 (nk <= 4) of one qs x qs block of a p x p token,
// the block's first sample being the token's sample (row0, col0); sample s of the block is
// the token's sample (row0 + s / qs, col0 + s % qs). acc[k].v[c] = the value gather_sample
// writes for channel 4g + c of that sample.
HD void gather_quad(const LevelTable& T, const TokenConst& t, int b, int p, int qs, int row0,
                    int col0, int s0, int nk, int g, F4 acc[4]) {
    for (int q = 0; q < t.nq; ++q) {
        const int m = t.lo + q;
        const float inv_s = 1.0f / (float)(1 << m);          // exact power of two
        const float* img = level_image(T, m, b) + 4 * g;     // channel stride 1 (NHWC4)
        const float wq = q == 0 ? 1.0f - t.frac : t.frac;
        FOVEA_UNROLL
        for (int k = 0; k < 4; ++k) {
            if (k >= nk) break;
            const int s = s0 + k, i = row0 + s / qs, j = col0 + s - (s / qs) * qs;
            const Tap tx = axis_tap(index_coord(sample_base_pos(t.cx_px, j, p, t.step), inv_s),
                                    T.w[m]);
            const Tap ty = axis_tap(index_coord(sample_base_pos(t.cy_px, i, p, t.step), inv_s),
                                    T.h[m]);
            const F4 v = bilerp4(img, T.sy[m], T.sx[m], ty, tx);
            FOVEA_UNROLL
            for (int c = 0; c < 4; ++c) {
                const float vw = v.v[c] * wq;
                acc[k].v[c] = q == 0 ? vw : acc[k].v[c] + vw;
            }
        }
    }
}

// float -> bfloat16 bits, round to nearest even, NaN -> 0x7fc0 (what torch's .to(bfloat16)
// does), written with integer operations so that both builds give the same bits.
HD unsigned short bf16_bits(float x) {
    union { float f; unsigned int u; } w;
    w.f = x;
    if ((w.u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)0x7fc0;
    const unsigned int rounding_bias = 0x7fffu + ((w.u >> 16) & 1u);
    return (unsigned short)((w.u + rounding_bias) >> 16);
}

// Store one output channel of a quad: nk values at dst (fp32, or bf16 when bf16 != 0).
// On the GPU a full, 16-byte aligned quad is one 128-bit store (8-byte for bf16).
HD void store_quad(void* dst, const F4 acc[4], int c, int nk, int bf16, bool vector_ok) {
    if (bf16) {
        unsigned short* o = (unsigned short*)dst;
#ifdef __CUDA_ARCH__
        if (vector_ok && nk == 4) {
            uint2 u;
            u.x = (unsigned int)bf16_bits(acc[0].v[c]) | ((unsigned int)bf16_bits(acc[1].v[c]) << 16);
            u.y = (unsigned int)bf16_bits(acc[2].v[c]) | ((unsigned int)bf16_bits(acc[3].v[c]) << 16);
            *reinterpret_cast<uint2*>(o) = u;
            return;
        }
#endif
        FOVEA_UNROLL
        for (int k = 0; k < 4; ++k)
            if (k < nk) o[k] = bf16_bits(acc[k].v[c]);
        return;
    }
    float* o = (float*)dst;
#ifdef __CUDA_ARCH__
    if (vector_ok && nk == 4) {
        *reinterpret_cast<float4*>(o) = make_float4(acc[0].v[c], acc[1].v[c], acc[2].v[c],
                                                    acc[3].v[c]);
        return;
    }
#endif
    FOVEA_UNROLL
    for (int k = 0; k < 4; ++k)
        if (k < nk) o[k] = acc[k].v[c];
}

// Everything one thread does for quad `quad` of token t: the samples, then the stores of
// its `channels` real channels, each repeated `temporal` times. The token's p x p samples
// are written as merge x merge blocks of side qs = p / merge, block-major: [merge^2, C, T,
// qs, qs], the patch layout of a Qwen2-VL-style processor (merge = 2: the four ViT patches
// of one merged token; T = 2: a still image repeated over temporal_patch_size). merge = 1,
// T = 1 is [C, p, p]. A thread's quad lies inside one block (qpb quads a block).
HD void gather_token_quad(const LevelTable& T, const TokenConst& tc, int b, int p, int merge,
                          int quad, int channels, int temporal, int bf16, void* token_out) {
    const int qs = p / merge, qq = qs * qs, qpb = (qq + 3) / 4;
    const int blk = quad / qpb, s0 = 4 * (quad - blk * qpb);
    const int nk = qq - s0 < 4 ? qq - s0 : 4;
    const int row0 = (blk / merge) * qs, col0 = (blk - (blk / merge) * merge) * qs;
    const bool vector_ok = (qq & 3) == 0;                // every quad starts 16-byte aligned
    const int esize = bf16 ? 2 : 4;
    for (int g = 0; 4 * g < channels; ++g) {
        F4 acc[4] = {};                                  // (k >= nk stays unused)
        gather_quad(T, tc, b, p, qs, row0, col0, s0, nk, g, acc);
        FOVEA_UNROLL
        for (int c = 0; c < 4; ++c) {
            if (4 * g + c >= channels) break;
            for (int u = 0; u < temporal; ++u) {
                const long long e = (((long long)blk * channels + 4 * g + c) * temporal + u) * qq
                                    + s0;
                store_quad((char*)token_out + e * esize, acc, c, nk, bf16, vector_ok);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Pyramid step (cv2.pyrDown): separable binomial [1 4 6 4 1] / 16, reflect-101 borders,
// evaluated at the kept samples only. Row blur first, then column blur, each summed in tap
// order (the order of fovea_core.pyramid.pyr_down).
// ---------------------------------------------------------------------------------------
HD int reflect101(int i, int n) {
    if (n == 1) return 0;
    while (i < 0 || i >= n) i = i < 0 ? -i : 2 * (n - 1) - i;
    return i;
}

HD float pyr_down_element(const float* src, int h, int w, int sy, int sx, int oy, int ox) {
    const float wt[5] = {0.0625f, 0.25f, 0.375f, 0.25f, 0.0625f};
    int xs[5];
    for (int k = 0; k < 5; ++k) xs[k] = reflect101(2 * ox - 2 + k, w) * sx;
    float acc = 0.0f;
    for (int r = 0; r < 5; ++r) {
        const float* row = src + reflect101(2 * oy - 2 + r, h) * sy;
        float hsum = row[xs[0]] * wt[0];
        for (int k = 1; k < 5; ++k) hsum = hsum + row[xs[k]] * wt[k];
        acc = r == 0 ? hsum * wt[0] : acc + hsum * wt[r];
    }
    return acc;
}

// ---------------------------------------------------------------------------------------
// LUT remap (cv2.remap, INTER_LINEAR, BORDER_CONSTANT 0) of one plane. Same operation order
// as fovea_core.sample.remap: the four taps weighted by (wx * wy), a tap outside the image
// weighted 0, summed top-left, top-right, bottom-left, bottom-right.
// ---------------------------------------------------------------------------------------
struct RemapTaps { int idx[4]; float wgt[4]; };
HD RemapTaps remap_taps(int h, int w, int sy, int sx, float x, float y) {
    const float x0f = floorf(x), y0f = floorf(y);
    const float fx = x - x0f, fy = y - y0f;
    const int x0 = (int)x0f, y0 = (int)y0f;
    RemapTaps r;
    for (int dy = 0; dy < 2; ++dy)
        for (int dx = 0; dx < 2; ++dx) {
            const int yi = y0 + dy, xi = x0 + dx, k = 2 * dy + dx;
            const bool ok = xi >= 0 && xi < w && yi >= 0 && yi < h;
            const float wx = dx ? fx : 1.0f - fx, wy = dy ? fy : 1.0f - fy;
            r.wgt[k] = ok ? wx * wy : 0.0f;
            const int yc = yi < 0 ? 0 : (yi > h - 1 ? h - 1 : yi);
            const int xc = xi < 0 ? 0 : (xi > w - 1 ? w - 1 : xi);
            r.idx[k] = yc * sy + xc * sx;
        }
    return r;
}

HD float remap_apply(const float* plane, const RemapTaps& r) {
    float acc = plane[r.idx[0]] * r.wgt[0];
    for (int k = 1; k < 4; ++k) acc = acc + plane[r.idx[k]] * r.wgt[k];
    return acc;
}

// ---------------------------------------------------------------------------------------
// V1-style allocation: one candidate token per call (see fovea_core/allocators/cortical.py
// for the derivation). Candidate slots of one image, in priority order:
//   [0, F_max)                   foveal block: fs_b x fs_b level-0 cells around the fixation
//                                (slot m valid iff m < fs_b^2), F_max = fs_max^2;
//   [F_max, F_max + R_max * A_max)  log-polar periphery, ring-major: ring r, ray a (< A_b)
//                                pointing in direction (a * stride) mod A_b,
//                                about isotropic in V1: rays 2 pi / A_b apart, rings a
//                                factor exp(rstep_b) apart in (E + e0) [Schwartz 1980],
//                                rstep_b ~ 2 pi / A_b tuned so exactly N fit;
//                                level = round(log2(local sample spacing / patch)),
//                                spacing ~ (E + e0) ~ 1 / M(E) [Horton & Hoyt 1991];
//   [F_max + R_max * A_max, ... + Gh * Gw)   fallback: the level-0 grid, row-major (only
//                                used when the periphery falls short of the budget).
// Geometry in double so the CPU, GPU and torch builds agree bit for bit on validity.
// ---------------------------------------------------------------------------------------
struct V1Params {
    int img_h, img_w, patch, num_levels, fs_max, r_max, a_max;
    double ppd, e0;  // pixels per degree, Horton-Hoyt e0 (deg)
};

HD void v1_candidate(const V1Params& P, double fx, double fy, int fs, int a_b, int r_b,
                     int stride, double rstep, int m, float* out_cx, float* out_cy,
                     int* out_level, int* out_valid) {
    const int p = P.patch;
    const int gh = (P.img_h + p - 1) / p, gw = (P.img_w + p - 1) / p;
    int c0 = (int)floor(fx / p - 0.5 * fs + 0.5), r0 = (int)floor(fy / p - 0.5 * fs + 0.5);
    c0 = c0 < 0 ? 0 : (c0 > gw - fs ? gw - fs : c0);
    r0 = r0 < 0 ? 0 : (r0 > gh - fs ? gh - fs : r0);
    const int nf = P.fs_max * P.fs_max, nlp = P.r_max * P.a_max;
    double x, y;
    int level = 0, valid = 1;
    if (m < nf || m >= nf + nlp) {  // a level-0 grid cell (fovea or fallback)
        int row, col;
        if (m < nf) { row = r0 + m / fs; col = c0 + m % fs; valid = m < fs * fs; }
        else { const int k = m - nf - nlp; row = k / gw; col = k % gw; }
        x = (col + 0.5) * p; y = (row + 0.5) * p;
    } else {
        const int k = m - nf, ring = k / P.a_max, ray = k % P.a_max;
        const double two_pi = 6.283185307179586;
        const double dth = two_pi / (a_b > 0 ? a_b : 1);
        const double ef = 0.5 * fs * p / P.ppd;                      // foveal radius, deg
        const double ecc = (ef + P.e0) * exp(rstep * (ring + 0.5)) - P.e0;
        // rays visited in a golden-ratio stride (coprime with A_b): a partly used outer ring
        // is spread evenly over all directions instead of filling one side
        const int dir = (int)(((long long)ray * stride) % (a_b > 0 ? a_b : 1));
        const double th = dth * (dir + 0.5 * (ring & 1));
        // snapped to 1/256 px so that libm and torch (1-ulp apart in cos/sin) agree exactly
        x = floor((fx + ecc * P.ppd * cos(th)) * 256.0 + 0.5) / 256.0;
        y = floor((fy + ecc * P.ppd * sin(th)) * 256.0 + 0.5) / 256.0;
        // tangential spacing ecc * dth, radial (ecc + e0) * rstep: geometric mean, in px
        const double spacing = sqrt(ecc * (ecc + P.e0) * dth * rstep) * P.ppd;
        level = (int)floor(log2(spacing / p) + 0.5);
        level = level < 0 ? 0 : (level > P.num_levels - 1 ? P.num_levels - 1 : level);
        const bool in_image = x >= 0.0 && x < P.img_w && y >= 0.0 && y < P.img_h;
        const bool in_fovea = x >= (double)c0 * p && x < (double)(c0 + fs) * p
                           && y >= (double)r0 * p && y < (double)(r0 + fs) * p;
        valid = (ray < a_b && ring < r_b && in_image && !in_fovea) ? 1 : 0;
    }
    x = x < P.img_w ? x : P.img_w;
    y = y < P.img_h ? y : P.img_h;
    *out_cx = (float)(x / P.img_w);
    *out_cy = (float)(y / P.img_h);
    *out_level = level;
    *out_valid = valid;
}
