// fovea_kernels.cuh -- the per-element math of every foveated kernel, written once.
//
// Every function here is HD: `__host__ __device__` under nvcc, a plain `static inline`
// C++ function under g++. fovea_kernels.cu wraps them (a) in `__global__` CUDA kernels,
// one thread per output element, and (b) in `extern "C"` CPU loops for the g++ build that
// fovea_core.kernels calls through ctypes. The torch references in fovea_core/sample.py and
// fovea_core/allocators/cortical.py implement the same formulas; tests/test_kernels.py
// checks the two builds against them.
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

// ---------------------------------------------------------------------------------------
// Packed pyramid: level m is a contiguous [B, H_m, W_m, C] float block (channels last) that
// starts at element offset[m] of one flat buffer. Channels-last keeps the C values of one
// bilinear tap in one cache line / memory transaction.
// ---------------------------------------------------------------------------------------
// One axis of a clamp-to-edge bilinear read: index coordinate -> two taps and a weight.
struct Tap { int i0, i1; float f; };
HD Tap axis_tap(float pos, int n) {
    pos = fminf(fmaxf(pos, 0.0f), (float)(n - 1));         // clamp-to-edge (replicate)
    const float f0 = floorf(pos);
    Tap t;
    t.i0 = (int)f0;
    t.i1 = t.i0 + 1 < n ? t.i0 + 1 : n - 1;
    t.f = pos - f0;
    return t;
}

// Base-pixel position of sample k (0 <= k < p) of a token centred at normalised c, spacing
// `step` = 2^lod base pixels, expressed as an index coordinate of a level with scale s = 2^m.
HD float sample_index_coord(float c, int n_img, int k, int p, float step, float s) {
    const float pos = c * (float)n_img + ((float)k - 0.5f * (float)(p - 1)) * step;
    return pos / s - 0.5f;
}

// Bilinear blend of the four taps of channel ch in one [H, W, C] image of a level.
HD float bilerp(const float* img, int w, int c, Tap ty, Tap tx, int ch) {
    const float top = img[((long long)ty.i0 * w + tx.i0) * c + ch] * (1.0f - tx.f)
                    + img[((long long)ty.i0 * w + tx.i1) * c + ch] * tx.f;
    const float bot = img[((long long)ty.i1 * w + tx.i0) * c + ch] * (1.0f - tx.f)
                    + img[((long long)ty.i1 * w + tx.i1) * c + ch] * tx.f;
    return top * (1.0f - ty.f) + bot * ty.f;
}

// Start of image b of level m in the packed buffer.
HD const float* level_image(const float* pyr, const long long* offsets, const int* sizes, int m,
                            int c, int b) {
    return pyr + offsets[m] + (long long)b * sizes[2 * m] * sizes[2 * m + 1] * c;
}

// One output element of the foveated patch gather.
//   token (b, n): centre (cx, cy) in [0, 1], level of detail lod >= 0 (integer -> bilinear,
//   fractional -> trilinear between floor(lod) and floor(lod) + 1).
//   sample (i, j) of the p x p grid, channel ch. Base position of sample k along an axis:
//   X_k = cx * W + (k - (p - 1) / 2) * 2^lod.
HD float gather_element(const float* pyr, const long long* offsets, const int* sizes,
                        int num_levels, int img_h, int img_w, int c, int p, int b, float cx,
                        float cy, float lod, int i, int j, int ch) {
    const float step = exp2f(lod);
    int lo = (int)floorf(lod);
    if (lo > num_levels - 1) lo = num_levels - 1;
    const float frac = lod - (float)lo;
    const int levels[2] = {lo, lo + 1};
    const float weights[2] = {1.0f - frac, frac};
    float val = 0.0f;
    for (int q = 0; q < 2; ++q) {
        const int m = levels[q];
        if (q == 1 && !(frac > 0.0f && m < num_levels)) break;
        const float s = exp2f((float)m);
        const int h = sizes[2 * m], w = sizes[2 * m + 1];
        const Tap tx = axis_tap(sample_index_coord(cx, img_w, j, p, step, s), w);
        const Tap ty = axis_tap(sample_index_coord(cy, img_h, i, p, step, s), h);
        const float v = bilerp(level_image(pyr, offsets, sizes, m, c, b), w, c, ty, tx, ch);
        val = q == 0 ? v * weights[0] : val + v * weights[1];
    }
    return val;
}

// ---------------------------------------------------------------------------------------
// LUT remap (cv2.remap, INTER_LINEAR, BORDER_CONSTANT 0) of an NCHW image plane.
// ---------------------------------------------------------------------------------------
HD float remap_element(const float* plane, int h, int w, float x, float y) {
    const float x0f = floorf(x), y0f = floorf(y);
    const float fx = x - x0f, fy = y - y0f;
    const int x0 = (int)x0f, y0 = (int)y0f;
    float acc = 0.0f;
    for (int dy = 0; dy < 2; ++dy) {
        const int yi = y0 + dy;
        const float wy = dy ? fy : 1.0f - fy;
        if (yi < 0 || yi >= h) continue;
        for (int dx = 0; dx < 2; ++dx) {
            const int xi = x0 + dx;
            const float wx = dx ? fx : 1.0f - fx;
            if (xi < 0 || xi >= w) continue;
            acc += plane[(long long)yi * w + xi] * (wx * wy);
        }
    }
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
