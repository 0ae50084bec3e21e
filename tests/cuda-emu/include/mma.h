/* mma.h of the CPU emulation: nvcuda::wmma for 16 x 16 x 16 tiles of __half with float
 * accumulators. Each lane holds a whole tile (the GPU spreads it over the warp); every *_sync
 * call first waits for the warp, as on the GPU; a store writes the lane's share (elements
 * lane, lane + 32, ...), so a reader that does not wait for the warp sees a partial tile.
 * Loads check the alignment WMMA requires (a 32-byte pointer, ldm a multiple of 16 bytes).
 * See tests/cuda-emu/cuda_emu.h. */
#ifndef IFLOW_EMU_MMA_H
#define IFLOW_EMU_MMA_H
#include "../cuda_emu.h"

void emu_wmma_check(const void *p, unsigned ldm, size_t elem_bytes);

namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void> struct fragment {
    static_assert(M == 16 && N == 16 && K == 16, "the emulation has 16 x 16 x 16 tiles only");
    enum { num_elements = 256 };
    float t[16][16];
};

template <typename U, typename T, typename L>
static inline void fill_fragment(fragment<U, 16, 16, 16, T, L> &f, float v)
{
    for (auto &r : f.t)
        for (auto &e : r)
            e = v;
}

template <typename U, typename L>
static inline void load_matrix_sync(fragment<U, 16, 16, 16, __half, L> &f, const __half *p, unsigned ldm)
{
    __syncwarp();
    emu_wmma_check(p, ldm, sizeof *p);
    const bool row = std::is_same<L, row_major>::value;
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++)
            f.t[i][j] = (float)(row ? p[(size_t)i * ldm + j] : p[(size_t)j * ldm + i]);
}

static inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float> &f, const float *p, unsigned ldm,
                                    layout_t l)
{
    __syncwarp();
    emu_wmma_check(p, ldm, sizeof *p);
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++)
            f.t[i][j] = l == mem_row_major ? p[(size_t)i * ldm + j] : p[(size_t)j * ldm + i];
}

static inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f, unsigned ldm,
                                     layout_t l)
{
    __syncwarp();
    emu_wmma_check(p, ldm, sizeof *p);
    for (int e = emu_lane(); e < 256; e += 32) {
        const int i = e / 16, j = e % 16;
        (l == mem_row_major ? p[(size_t)i * ldm + j] : p[(size_t)j * ldm + i]) = f.t[i][j];
    }
}

/* d = a b + c, products of halves exact in float, sums in float */
template <typename LA, typename LB>
static inline void mma_sync(fragment<accumulator, 16, 16, 16, float> &d,
                            const fragment<matrix_a, 16, 16, 16, __half, LA> &a,
                            const fragment<matrix_b, 16, 16, 16, __half, LB> &b,
                            const fragment<accumulator, 16, 16, 16, float> &c)
{
    __syncwarp();
    float r[16][16];
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++) {
            float s = c.t[i][j];
            for (int k = 0; k < 16; k++)
                s += a.t[i][k] * b.t[k][j];
            r[i][j] = s;
        }
    memcpy(d.t, r, sizeof r);
}
} // namespace wmma
} // namespace nvcuda
#endif
