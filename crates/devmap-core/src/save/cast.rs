//! Floating-point casts as torch's `.to(dtype)` makes them on an x86-64 CPU with its
//! AVX2/AVX-512 kernels, bit for bit (with its scalar kernels only NaN payloads differ):
//! round to nearest, ties to even; subnormals kept; infinities kept; and NaNs as torch
//! writes them. Widening (f16 or bf16 to f32) is exact. Narrowing goes through the
//! `half` crate's rounding, with torch's NaN patterns where they differ from it:
//! float32 to bfloat16 writes every NaN as `0xFFFF` (torch's vectorised kernel), and
//! float16 to bfloat16 (which torch computes through float32 with its scalar
//! rounding) writes `0x7FC0`. `tests/python/dtype_cast.py` checks every rule against
//! torch over all 65,536 half-precision values and millions of float32 ones.

use half::f16;
use half::slice::HalfFloatSliceExt;

/// Elements converted per block by the slice conversions (on the stack: 4 KiB of f16
/// and 8 KiB of f32).
const BLOCK: usize = 2048;

use crate::types::DType;

/// The floating dtypes devmap casts between.
pub fn is_castable(dtype: DType) -> bool {
    matches!(dtype, DType::F16 | DType::BF16 | DType::F32)
}

/// Whether a dtype is floating point at all (what `--dtype` is about).
pub fn is_floating(dtype: DType) -> bool {
    matches!(
        dtype,
        DType::F16
            | DType::BF16
            | DType::F32
            | DType::F64
            | DType::F8E4M3
            | DType::F8E5M2
            | DType::F8E8M0
    )
}

/// Casts the little-endian elements of `src` (dtype `from`) into `dst` (dtype `to`).
/// `src` holds whole elements and `dst` exactly as many elements of `to`.
pub fn cast(from: DType, to: DType, src: &[u8], dst: &mut [u8]) {
    debug_assert!(is_castable(from) && is_castable(to));
    debug_assert_eq!(
        src.len() / from.size() as usize,
        dst.len() / to.size() as usize
    );
    if (from, to) == (DType::F32, DType::BF16) {
        // The hot path of the commonest cast: blocks of eight elements in fixed-size
        // arrays, so the compiler sees whole vectors, not one element at a time.
        let blocks = src.len() / 32;
        for (i, o) in src.chunks_exact(32).zip(dst.chunks_exact_mut(16)) {
            let mut words = [0u32; 8];
            for (w, b) in words.iter_mut().zip(i.chunks_exact(4)) {
                *w = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
            let mut halves = [0u16; 8];
            for (h, &w) in halves.iter_mut().zip(&words) {
                *h = bf16_bits(w, VECTOR_NAN);
            }
            for (b, h) in o.chunks_exact_mut(2).zip(halves) {
                b.copy_from_slice(&h.to_le_bytes());
            }
        }
        let tail = src[blocks * 32..].chunks_exact(4);
        for (i, o) in tail.zip(dst[blocks * 16..].chunks_exact_mut(2)) {
            let bits = bf16_bits(u32::from_le_bytes([i[0], i[1], i[2], i[3]]), VECTOR_NAN);
            o.copy_from_slice(&bits.to_le_bytes());
        }
        return;
    }
    match (from, to) {
        (a, b) if a == b => dst.copy_from_slice(src),
        // float16 <-> float32 (and the two 16-bit formats, through float32, exact for
        // both) a block at a time through `half`'s slice conversions, which use the
        // CPU's F16C instructions where it has them: the same rounding and NaN handling
        // as the element-wise path, chosen at run time.
        (DType::F32, DType::F16) => to_f16(src, 4, dst, |b| {
            f32::from_le_bytes([b[0], b[1], b[2], b[3]])
        }),
        (DType::BF16, DType::F16) => to_f16(src, 2, dst, |b| {
            f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16)
        }),
        (DType::F16, DType::F32) => from_f16(src, dst, 4, |w, b| {
            b.copy_from_slice(&w.to_le_bytes());
        }),
        // torch computes this cast through float32 with its scalar rounding: every NaN
        // becomes 0x7FC0.
        (DType::F16, DType::BF16) => from_f16(src, dst, 2, |w, b| {
            b.copy_from_slice(&bf16_bits(w.to_bits(), SCALAR_NAN).to_le_bytes());
        }),
        (DType::BF16, DType::F32) => {
            // bfloat16 is the top half of a float32: a shift, signalling NaNs included;
            // eight at a time in fixed-size arrays, so the loop vectorises.
            let blocks = src.len() / 16;
            for (i, o) in src.chunks_exact(16).zip(dst.chunks_exact_mut(32)) {
                let mut words = [0u32; 8];
                for (w, b) in words.iter_mut().zip(i.chunks_exact(2)) {
                    *w = u32::from(u16::from_le_bytes([b[0], b[1]])) << 16;
                }
                for (b, w) in o.chunks_exact_mut(4).zip(words) {
                    b.copy_from_slice(&w.to_le_bytes());
                }
            }
            let tail = src[blocks * 16..].chunks_exact(2);
            for (i, o) in tail.zip(dst[blocks * 32..].chunks_exact_mut(4)) {
                let bits = u32::from(u16::from_le_bytes([i[0], i[1]])) << 16;
                o.copy_from_slice(&bits.to_le_bytes());
            }
        }
        // Guarded by is_castable: every other pair is refused before a save starts.
        _ => dst.fill(0),
    }
}

/// The NaN torch's vectorised float32 -> bfloat16 kernel writes, and the one its scalar
/// rounding writes (float16 -> bfloat16 goes that way).
const VECTOR_NAN: u16 = 0xFFFF;
const SCALAR_NAN: u16 = 0x7FC0;

/// `x` rounded to bfloat16 as torch rounds (to nearest, ties to even; a NaN to its one
/// quiet NaN, as torch's scalar rounding writes it), held as f32: on the bits,
/// branch-free but for NaN, so the loops around it vectorise.
#[inline]
pub(crate) fn round_to_bf16(x: f32) -> f32 {
    if x.is_nan() {
        return f32::from_bits(u32::from(SCALAR_NAN) << 16);
    }
    f32::from_bits(u32::from(bf16_of_finite(x.to_bits())) << 16)
}

/// A finite (or infinite) float32's bits rounded to bfloat16, to nearest even, as
/// torch rounds: the dequantizers' products, which are never NaN, go through this.
#[inline]
pub(crate) fn bf16_of_finite(x: u32) -> u16 {
    (x.wrapping_add(0x7FFF + ((x >> 16) & 1)) >> 16) as u16
}

/// A float32's bits rounded to bfloat16, to nearest even, on the bits (no branch but
/// the NaN select, so a loop over it vectorises); every NaN becomes `nan`.
#[inline]
fn bf16_bits(x: u32, nan: u16) -> u16 {
    let rounded = bf16_of_finite(x);
    if (x & 0x7FFF_FFFF) > 0x7F80_0000 {
        nan
    } else {
        rounded
    }
}

/// Elements of `size` bytes in `src`, read as float32 by `widen`, written to `dst` as
/// float16, a block at a time.
#[inline]
fn to_f16(src: &[u8], size: usize, dst: &mut [u8], widen: impl Fn(&[u8]) -> f32) {
    let mut wide = [0f32; BLOCK];
    let mut narrow = [f16::ZERO; BLOCK];
    for (i, o) in src.chunks(BLOCK * size).zip(dst.chunks_mut(BLOCK * 2)) {
        let n = i.len() / size;
        for (w, b) in wide.iter_mut().zip(i.chunks_exact(size)) {
            *w = widen(b);
        }
        narrow[..n].convert_from_f32_slice(&wide[..n]);
        for (b, h) in o.chunks_exact_mut(2).zip(&narrow[..n]) {
            b.copy_from_slice(&h.to_bits().to_le_bytes());
        }
    }
}

/// float16 elements of `src`, widened to float32 a block at a time and written to
/// `dst` by `write` as elements of `size` bytes.
#[inline]
fn from_f16(src: &[u8], dst: &mut [u8], size: usize, write: impl Fn(f32, &mut [u8])) {
    let mut narrow = [f16::ZERO; BLOCK];
    let mut wide = [0f32; BLOCK];
    for (i, o) in src.chunks(BLOCK * 2).zip(dst.chunks_mut(BLOCK * size)) {
        let n = i.len() / 2;
        for (h, b) in narrow.iter_mut().zip(i.chunks_exact(2)) {
            *h = f16::from_bits(u16::from_le_bytes([b[0], b[1]]));
        }
        narrow[..n].convert_to_f32_slice(&mut wide[..n]);
        for (b, &w) in o.chunks_exact_mut(size).zip(&wide[..n]) {
            write(w, b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(from: DType, to: DType, bits: u32) -> u32 {
        let src = &bits.to_le_bytes()[..from.size() as usize];
        let mut dst = vec![0u8; to.size() as usize];
        cast(from, to, src, &mut dst);
        let mut out = [0u8; 4];
        out[..dst.len()].copy_from_slice(&dst);
        u32::from_le_bytes(out)
    }

    #[test]
    fn rounding_ties_subnormals_infinities_and_nans() {
        use DType::{BF16, F16, F32};
        // 1 + 2^-8 is halfway between two bfloat16 values: ties go to the even one.
        assert_eq!(one(F32, BF16, 0x3F80_8000), 0x3F80);
        assert_eq!(one(F32, BF16, 0x3F81_8000), 0x3F82);
        assert_eq!(one(F32, BF16, 0x3F80_8001), 0x3F81);
        // float16: 2049 rounds to 2048 (tie, even), 2051 to 2052.
        assert_eq!(one(F32, F16, 2049f32.to_bits()), 0x6800);
        assert_eq!(one(F32, F16, 2051f32.to_bits()), 0x6802);
        // The smallest float16 subnormal, and a value that rounds to it.
        assert_eq!(one(F32, F16, 5.960_464_5e-8f32.to_bits()), 0x0001);
        assert_eq!(one(F16, F32, 0x0001), 5.960_464_5e-8f32.to_bits());
        // Overflow becomes infinity; infinities stay.
        assert_eq!(one(F32, F16, 70_000f32.to_bits()), 0x7C00);
        assert_eq!(one(F32, BF16, f32::NEG_INFINITY.to_bits()), 0xFF80);
        // NaNs as torch writes them.
        assert_eq!(one(F32, BF16, 0x7FC0_0000), 0xFFFF);
        assert_eq!(one(F32, F16, 0x7F81_2345), 0x7E09);
        assert_eq!(one(F16, BF16, 0x7E01), 0x7FC0);
        assert_eq!(one(BF16, F16, 0x7FC1), 0x7E08);
        // Widening is exact.
        assert_eq!(one(BF16, F32, 0x7FC1), 0x7FC1_0000);
        assert_eq!(one(BF16, F32, 0x7F81), 0x7F81_0000);
        assert_eq!(one(BF16, F32, 0x3F80), 1f32.to_bits());
    }
}
