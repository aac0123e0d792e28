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

use crate::types::dtype::DType;

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
        // Round to nearest even on the bits, without branches but the NaN select,
        // so the loop vectorises: the hot path of the commonest cast.
        let one = |b: u32| -> u16 {
            let rounded = (b.wrapping_add(0x7FFF + ((b >> 16) & 1)) >> 16) as u16;
            if (b & 0x7FFF_FFFF) > 0x7F80_0000 {
                0xFFFF
            } else {
                rounded
            }
        };
        // Blocks of eight elements in fixed-size arrays: the compiler sees whole
        // vectors, not one element at a time.
        let blocks = src.len() / 32;
        for (i, o) in src.chunks_exact(32).zip(dst.chunks_exact_mut(16)) {
            let mut words = [0u32; 8];
            for (w, b) in words.iter_mut().zip(i.chunks_exact(4)) {
                *w = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
            let mut halves = [0u16; 8];
            for (h, &w) in halves.iter_mut().zip(&words) {
                *h = one(w);
            }
            for (b, h) in o.chunks_exact_mut(2).zip(halves) {
                b.copy_from_slice(&h.to_le_bytes());
            }
        }
        let tail = src[blocks * 32..].chunks_exact(4);
        for (i, o) in tail.zip(dst[blocks * 16..].chunks_exact_mut(2)) {
            let bits = one(u32::from_le_bytes([i[0], i[1], i[2], i[3]]));
            o.copy_from_slice(&bits.to_le_bytes());
        }
        return;
    }
    match (from, to) {
        (a, b) if a == b => dst.copy_from_slice(src),
        // float16 <-> float32 a block at a time through `half`'s slice conversions,
        // which use the CPU's F16C instructions where it has them (the same rounding and
        // NaN handling as the element-wise path, chosen at run time).
        (DType::F32, DType::F16) => {
            let mut wide = [0f32; BLOCK];
            let mut narrow = [f16::ZERO; BLOCK];
            for (i, o) in src.chunks(BLOCK * 4).zip(dst.chunks_mut(BLOCK * 2)) {
                let n = i.len() / 4;
                for (w, b) in wide.iter_mut().zip(i.chunks_exact(4)) {
                    *w = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
                narrow[..n].convert_from_f32_slice(&wide[..n]);
                for (b, h) in o.chunks_exact_mut(2).zip(&narrow[..n]) {
                    b.copy_from_slice(&h.to_bits().to_le_bytes());
                }
            }
        }
        (DType::F16, DType::F32) => {
            let mut narrow = [f16::ZERO; BLOCK];
            let mut wide = [0f32; BLOCK];
            for (i, o) in src.chunks(BLOCK * 2).zip(dst.chunks_mut(BLOCK * 4)) {
                let n = i.len() / 2;
                for (h, b) in narrow.iter_mut().zip(i.chunks_exact(2)) {
                    *h = f16::from_bits(u16::from_le_bytes([b[0], b[1]]));
                }
                narrow[..n].convert_to_f32_slice(&mut wide[..n]);
                for (b, w) in o.chunks_exact_mut(4).zip(&wide[..n]) {
                    b.copy_from_slice(&w.to_le_bytes());
                }
            }
        }
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
        // Between the two 16-bit formats through float32 (exact for both), a block at
        // a time: bfloat16 widens by a shift, float16 through `half`'s slices (F16C).
        (DType::F16, DType::BF16) => {
            let mut narrow = [f16::ZERO; BLOCK];
            let mut wide = [0f32; BLOCK];
            for (i, o) in src.chunks(BLOCK * 2).zip(dst.chunks_mut(BLOCK * 2)) {
                let n = i.len() / 2;
                for (h, b) in narrow.iter_mut().zip(i.chunks_exact(2)) {
                    *h = f16::from_bits(u16::from_le_bytes([b[0], b[1]]));
                }
                narrow[..n].convert_to_f32_slice(&mut wide[..n]);
                for (b, w) in o.chunks_exact_mut(2).zip(&wide[..n]) {
                    // torch computes this cast through float32 with its scalar
                    // rounding: every NaN becomes 0x7FC0.
                    let x = w.to_bits();
                    let bits = if (x & 0x7FFF_FFFF) > 0x7F80_0000 {
                        0x7FC0
                    } else {
                        (x.wrapping_add(0x7FFF + ((x >> 16) & 1)) >> 16) as u16
                    };
                    b.copy_from_slice(&bits.to_le_bytes());
                }
            }
        }
        (DType::BF16, DType::F16) => {
            let mut wide = [0f32; BLOCK];
            let mut narrow = [f16::ZERO; BLOCK];
            for (i, o) in src.chunks(BLOCK * 2).zip(dst.chunks_mut(BLOCK * 2)) {
                let n = i.len() / 2;
                for (w, b) in wide.iter_mut().zip(i.chunks_exact(2)) {
                    *w = f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16);
                }
                narrow[..n].convert_from_f32_slice(&wide[..n]);
                for (b, h) in o.chunks_exact_mut(2).zip(&narrow[..n]) {
                    b.copy_from_slice(&h.to_bits().to_le_bytes());
                }
            }
        }
        // Guarded by is_castable: every other pair is refused before a save starts.
        _ => dst.fill(0),
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
