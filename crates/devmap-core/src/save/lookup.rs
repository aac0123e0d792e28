//! The lookup tables the 4-bit and 8-bit dequantizers write through: every output a
//! quantized code can have under one scale (`(v − z) · s`, rounded as the reference
//! rounds it, in the output dtype), made once per group or block, and the expansion of
//! packed nibbles through them: eight values a store, or, in a caller compiled for AVX2,
//! 32 values a step by byte shuffles. A code's output is a table entry on every path,
//! so the bytes never depend on the CPU.

use super::cast::bf16_of_finite;
use super::fp8::Fp8Bits;
use crate::types::DType;

/// Each byte of `bytes` as two values (the low nibble first), looked up in `table`
/// into `dst`. Four bytes at a time, their outputs gathered into 8-byte stores.
#[inline]
pub(crate) fn expand_nibbles<const SIZE: usize>(
    bytes: &[u8],
    table: &[[u8; SIZE]; 16],
    dst: &mut [u8],
) {
    let entry = |b: u8| -> u64 {
        let mut wide = [0u8; 8];
        wide[..SIZE].copy_from_slice(&table[usize::from(b)]);
        u64::from_le_bytes(wide)
    };
    let shift = 8 * SIZE as u32;
    let pair = |b: u8| entry(b & 0xF) | entry(b >> 4) << (shift % 64);
    let mut quads = bytes.chunks_exact(4);
    let mut out = dst.chunks_exact_mut(8 * SIZE);
    for (quad, o) in (&mut quads).zip(&mut out) {
        if SIZE == 2 {
            let first = pair(quad[0]) | pair(quad[1]) << 32;
            let second = pair(quad[2]) | pair(quad[3]) << 32;
            o[..8].copy_from_slice(&first.to_le_bytes());
            o[8..].copy_from_slice(&second.to_le_bytes());
        } else {
            for (b, o) in quad.iter().zip(o.chunks_exact_mut(2 * SIZE)) {
                o[..SIZE].copy_from_slice(&table[usize::from(b & 0xF)]);
                o[SIZE..].copy_from_slice(&table[usize::from(b >> 4)]);
            }
        }
    }
    let rest = quads.remainder();
    let tail = out.into_remainder();
    for (b, o) in rest.iter().zip(tail.chunks_exact_mut(2 * SIZE)) {
        o[..SIZE].copy_from_slice(&table[usize::from(b & 0xF)]);
        o[SIZE..].copy_from_slice(&table[usize::from(b >> 4)]);
    }
}

/// [`expand_nibbles`], for 2-byte outputs (bfloat16, float16) by byte shuffles: each
/// value's low and high output bytes looked up in two 16-byte tables, 32 values (16
/// bytes in, 64 out) a step, the rest (and 4-byte outputs) through [`expand_nibbles`].
/// Only for a caller
/// compiled for AVX2 (a `multiversion` function's AVX2 version): the same bytes as
/// [`expand_nibbles`], a table lookup either way.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(crate) fn expand_nibbles_shuffled<const SIZE: usize>(
    bytes: &[u8],
    table: &[[u8; SIZE]; 16],
    dst: &mut [u8],
) {
    if SIZE != 2 {
        return expand_nibbles(bytes, table, dst);
    }
    use std::arch::x86_64::{
        __m128i, _mm_and_si128, _mm_extract_epi64, _mm_set_epi64x, _mm_set1_epi8, _mm_shuffle_epi8,
        _mm_srli_epi16, _mm_unpackhi_epi8, _mm_unpacklo_epi8,
    };
    let vector = |b: [u8; 16]| {
        let x = u128::from_le_bytes(b);
        _mm_set_epi64x((x >> 64) as i64, x as i64)
    };
    let lows = vector(std::array::from_fn(|v| table[v][0]));
    let highs = vector(std::array::from_fn(|v| table[v][1]));
    let store = |v: __m128i, o: &mut [u8]| {
        o[..8].copy_from_slice(&_mm_extract_epi64::<0>(v).to_le_bytes());
        o[8..16].copy_from_slice(&_mm_extract_epi64::<1>(v).to_le_bytes());
    };
    let nibble = _mm_set1_epi8(0x0F);
    let (steps, rest) = bytes.as_chunks::<16>();
    let (outs, _) = dst.as_chunks_mut::<64>();
    for (&b, o) in steps.iter().zip(outs.iter_mut()) {
        let b = vector(b);
        let low = _mm_and_si128(b, nibble);
        let high = _mm_and_si128(_mm_srli_epi16::<4>(b), nibble);
        // The values in order: each byte's low nibble, then its high one.
        for (k, values) in [_mm_unpacklo_epi8(low, high), _mm_unpackhi_epi8(low, high)]
            .into_iter()
            .enumerate()
        {
            let (lo, hi) = (
                _mm_shuffle_epi8(lows, values),
                _mm_shuffle_epi8(highs, values),
            );
            store(_mm_unpacklo_epi8(lo, hi), &mut o[k * 32..]);
            store(_mm_unpackhi_epi8(lo, hi), &mut o[k * 32 + 16..]);
        }
    }
    let done = steps.len() * 16;
    expand_nibbles(rest, table, &mut dst[done * 4..]);
}

/// `table[v]` = the output bits of `(v + base) · s`, as [`output_bits`] makes them
/// (the common dtype pairs spelled out, so the conversion inlines into the loop).
#[inline]
pub(crate) fn fill_table<const SIZE: usize>(
    table: &mut [[u8; SIZE]],
    base: i32,
    s: f32,
    (sd, to): (DType, DType),
) {
    #[inline]
    fn fill<const SIZE: usize>(
        table: &mut [[u8; SIZE]],
        base: i32,
        s: f32,
        bits: impl Fn(f32) -> u32,
    ) {
        for (v, entry) in table.iter_mut().enumerate() {
            let product = (v as i32 + base) as f32 * s;
            entry.copy_from_slice(&bits(product).to_le_bytes()[..SIZE]);
        }
    }
    match (sd, to) {
        // Rounding to bfloat16 twice is rounding once.
        (DType::BF16 | DType::F32, DType::BF16) => fill(table, base, s, |p| {
            u32::from(half::bf16::from_f32(p).to_bits())
        }),
        (DType::F16 | DType::F32, DType::F16) => fill(table, base, s, |p| {
            u32::from(half::f16::from_f32(p).to_bits())
        }),
        (DType::F32, DType::F32) => fill(table, base, s, f32::to_bits),
        _ => fill(table, base, s, |p| output_bits(p, sd, to)),
    }
}

/// An exact f32 product rounded to the scale's dtype `sd`, then converted to `to`: the
/// bits of the output element (low bytes, little-endian). The values are finite, where
/// the `half` crate's round-to-nearest-even is torch's (`save::cast`).
#[inline]
pub(crate) fn output_bits(product: f32, sd: DType, to: DType) -> u32 {
    let rounded = match sd {
        DType::BF16 => half::bf16::from_f32(product).to_f32(),
        DType::F16 => half::f16::from_f32(product).to_f32(),
        _ => product,
    };
    match to {
        DType::BF16 => u32::from(half::bf16::from_f32(rounded).to_bits()),
        DType::F16 => u32::from(half::f16::from_f32(rounded).to_bits()),
        _ => rounded.to_bits(),
    }
}

/// Exact f32 products rounded to the scale's dtype `sd`, then converted to `to`, into
/// `output` (as many elements as `floats`; `rounded` holds the middle step).
pub(crate) fn round_and_convert(
    floats: &[u8],
    sd: DType,
    to: DType,
    rounded: &mut Vec<u8>,
    output: &mut [u8],
) {
    let elements = floats.len() / 4;
    debug_assert_eq!(output.len(), elements * to.size() as usize);
    let mid: &[u8] = if sd == DType::F32 {
        floats
    } else {
        rounded.resize(elements * sd.size() as usize, 0);
        super::cast::cast(DType::F32, sd, floats, rounded);
        rounded
    };
    if sd == to {
        output.copy_from_slice(mid);
    } else {
        super::cast::cast(sd, to, mid, output);
    }
}

/// Exact f32 products rounded to the scale's dtype `sd`, then converted to `to`, into
/// `output`: the bits [`output_bits`] gives. For bfloat16 and float32 outputs in one
/// pass on the bits, eight values at a time (compiled for AVX2 and AVX-512 too), rather
/// than [`round_and_convert`]'s casts through two buffers; float16 outputs go that way.
pub(crate) fn round_products(
    products: &[f32],
    sd: DType,
    to: DType,
    (floats, rounded): (&mut Vec<u8>, &mut Vec<u8>),
    output: &mut [u8],
) {
    debug_assert_eq!(output.len(), products.len() * to.size() as usize);
    match to {
        DType::BF16 | DType::F32 => round_products_fused(products, sd, to == DType::F32, output),
        _ => {
            floats.clear();
            floats.extend(products.iter().flat_map(|p| p.to_le_bytes()));
            round_and_convert(floats, sd, to, rounded, output);
        }
    }
}

#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512vl+avx2+fma",
    "x86_64+avx2+fma",
    "aarch64+neon"
))]
fn round_products_fused(products: &[f32], sd: DType, to_f32: bool, output: &mut [u8]) {
    let p = |p: f32| p;
    match (sd, to_f32) {
        (DType::F16, false) => fused::<2, _>(products, output, p, f16_value),
        (DType::F16, true) => fused::<4, _>(products, output, p, f16_value),
        (DType::BF16, false) => fused::<2, _>(products, output, p, bf16_value),
        (DType::BF16, true) => fused::<4, _>(products, output, p, bf16_value),
        (_, false) => fused::<2, _>(products, output, p, p),
        (_, true) => fused::<4, _>(products, output, p, p),
    }
}

/// 8-bit values of one group (zero point `z`, scale `s`) as `(q − z) · s` in f32 (exact
/// for a float16 or bfloat16 scale; one rounding for a float32 one, as torch's product
/// in that dtype), rounded to `sd` and written as `to`, bfloat16 or float32, into
/// `output`: [`round_products`] of their products in one pass. False, writing nothing,
/// for other outputs.
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512vl+avx2+fma",
    "x86_64+avx2+fma",
    "aarch64+neon"
))]
pub(crate) fn dequantize_bytes(
    bytes: &[u8],
    (z, s): (i32, f32),
    (sd, to): (DType, DType),
    output: &mut [u8],
) -> bool {
    // With a float16 scale, AVX-512 rounds to float16 by its conversion instructions.
    let done = match (sd, to) {
        (DType::F16, DType::BF16 | DType::F32) => multiversion::target::match_target! {
            "x86_64+avx512f" => if to == DType::BF16 {
                crate::save::avx512::bytes_through_f16::<2>(bytes, (z, s), output)
            } else {
                crate::save::avx512::bytes_through_f16::<4>(bytes, (z, s), output)
            },
            _ => 0,
        },
        _ => 0,
    };
    fused_to(
        &bytes[done..],
        (sd, to),
        &mut output[done * to.size() as usize..],
        move |q: u8| (i32::from(q) - z) as f32 * s,
    )
}

/// FP8 codes of one block (none of them [`Fp8Bits::any_special`]) times the block's
/// scale `s` in f32, each code's value decoded on its bits ([`Fp8Bits::value`], not
/// looked up: a loop of lookups does not vectorise), rounded to `sd` and written as
/// `to`, bfloat16 or float32, into `output`: [`round_products`] of their products in
/// one pass. False, writing nothing, for other outputs.
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512vl+avx2+fma",
    "x86_64+avx2+fma",
    "aarch64+neon"
))]
pub(crate) fn dequantize_codes(
    codes: &[u8],
    (format, s): (Fp8Bits, f32),
    (sd, to): (DType, DType),
    output: &mut [u8],
) -> bool {
    fused_to(codes, (sd, to), output, move |c: u8| format.value(c) * s)
}

/// [`fused`] for the rounding to `sd` and the output `to` (bfloat16 or float32; false
/// for others), each input's product `product`.
#[allow(clippy::inline_always)]
#[inline(always)]
fn fused_to<T: Copy>(
    inputs: &[T],
    (sd, to): (DType, DType),
    output: &mut [u8],
    product: impl Fn(T) -> f32,
) -> bool {
    let same = |p: f32| p;
    match (sd, to) {
        (DType::F16, DType::BF16) => fused::<2, _>(inputs, output, product, f16_value),
        (DType::F16, DType::F32) => fused::<4, _>(inputs, output, product, f16_value),
        (DType::BF16, DType::BF16) => fused::<2, _>(inputs, output, product, bf16_value),
        (DType::BF16, DType::F32) => fused::<4, _>(inputs, output, product, bf16_value),
        (DType::F32, DType::BF16) => fused::<2, _>(inputs, output, product, same),
        (DType::F32, DType::F32) => fused::<4, _>(inputs, output, product, same),
        _ => return false,
    }
    true
}

/// Each input's product (`product`), rounded by `round` (to the scale's dtype, kept as
/// f32), then written as bfloat16 (`SIZE` 2, to nearest even) or float32 (`SIZE` 4).
/// Always inlined, as are the roundings: a call out of the multiversioned function
/// would run at the baseline's vector width.
#[allow(clippy::inline_always)]
#[inline(always)]
fn fused<const SIZE: usize, T: Copy>(
    inputs: &[T],
    output: &mut [u8],
    product: impl Fn(T) -> f32,
    round: impl Fn(f32) -> f32,
) {
    let write = |x: T, o: &mut [u8]| {
        let bits = round(product(x)).to_bits();
        if SIZE == 2 {
            o.copy_from_slice(&bf16_of_finite(bits).to_le_bytes());
        } else {
            o.copy_from_slice(&bits.to_le_bytes());
        }
    };
    let mut eights = inputs.chunks_exact(8);
    let mut out = output.chunks_exact_mut(8 * SIZE);
    for (x, o) in (&mut eights).zip(&mut out) {
        for (x, o) in x.iter().zip(o.chunks_exact_mut(SIZE)) {
            write(*x, o);
        }
    }
    let tail = out.into_remainder();
    for (x, o) in eights.remainder().iter().zip(tail.chunks_exact_mut(SIZE)) {
        write(*x, o);
    }
}

/// A finite f32 rounded to float16, to nearest even, as an f32 (what `half`'s
/// `f16::from_f32(p).to_f32()` gives), on the bits: 11 significant bits in float16's
/// normal range; below it (its subnormals) a multiple of 2^-24, rounded by the FPU
/// itself in `[0.5, 1)`, where an f32's step is 2^-24; past 65504, infinity.
#[allow(clippy::inline_always)]
#[inline(always)]
fn f16_value(p: f32) -> f32 {
    // Selects by masks, not branches, so a loop over it vectorises.
    let select = |pick: bool, a: u32, b: u32| {
        let mask = 0u32.wrapping_sub(u32::from(pick));
        (a & mask) | (b & !mask)
    };
    let bits = p.to_bits();
    let sign = bits & 0x8000_0000;
    let magnitude = bits & 0x7FFF_FFFF;
    let normal = bits.wrapping_add(0x0FFF + ((bits >> 13) & 1)) & 0xFFFF_E000;
    let small = ((f32::from_bits(magnitude) + 0.75) - 0.75).to_bits() | sign;
    // 2^-14, float16's least normal; 65504, its greatest.
    let value = select(magnitude < 0x3880_0000, small, normal);
    f32::from_bits(select(
        value & 0x7FFF_FFFF > 0x477F_E000,
        sign | 0x7F80_0000,
        value,
    ))
}

/// A finite f32 rounded to bfloat16, to nearest even, as an f32.
#[allow(clippy::inline_always)]
#[inline(always)]
fn bf16_value(p: f32) -> f32 {
    f32::from_bits(u32::from(bf16_of_finite(p.to_bits())) << 16)
}

/// Rows of 4-bit values (two a byte, the low nibble first) where each input has a group
/// of its own (`of[i]` of `groups`: GPTQ's or compressed-tensors' `g_idx` out of order,
/// act order): row `first + k`'s value at input `i` is
/// entry `tables[(first + k) · groups + of[i]][nibble]`, the nibbles in input order (the
/// low one first in each byte), into `output` (row `first + k` at `k · inputs` values).
pub(crate) fn expand_by_input<const SIZE: usize>(
    (columns, stride): (&[u8], usize),
    (first, count): (usize, usize),
    (of, groups): (&[u32], usize),
    tables: &[[[u8; SIZE]; 16]],
    output: &mut [u8],
) {
    let inputs = of.len();
    for k in 0..count {
        let row = &columns[k * stride..k * stride + inputs / 2];
        let own = &tables[(first + k) * groups..(first + k + 1) * groups];
        let out = &mut output[k * inputs * SIZE..(k + 1) * inputs * SIZE];
        let pairs = row.iter().zip(of.as_chunks::<2>().0);
        for ((&byte, &[low, high]), dst) in pairs.zip(out.chunks_exact_mut(2 * SIZE)) {
            let (a, b) = dst.split_at_mut(SIZE);
            a.copy_from_slice(&own[low as usize][usize::from(byte & 15)]);
            b.copy_from_slice(&own[high as usize][usize::from(byte >> 4)]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The roundings on the bits agree with `half`'s for f32s across the whole range
    /// (every 4,099th bit pattern, and each side of float16's subnormal edge), not only
    /// for the products of a scale (which never need float16's subnormal rounding).
    #[test]
    fn rounding_on_the_bits_is_halfs() {
        let edge = 6.103_515_6e-5f32.to_bits();
        let patterns = (0..=u32::MAX)
            .step_by(4099)
            .chain(edge - 20_000..edge + 20_000);
        for x in patterns.map(f32::from_bits).filter(|x| x.is_finite()) {
            assert_eq!(
                f16_value(x).to_bits(),
                half::f16::from_f32(x).to_f32().to_bits(),
                "{x:e} to float16"
            );
            assert_eq!(
                bf16_value(x).to_bits(),
                half::bf16::from_f32(x).to_f32().to_bits(),
                "{x:e} to bfloat16"
            );
        }
    }

    /// The fused rounding gives [`output_bits`]'s bits for every product a packed
    /// value can make with a finite scale: each float16 and bfloat16 scale (every bit
    /// pattern) times each `q − z` of 8 bits (−255..=255), and float32 scales; to
    /// bfloat16 and float32, and (through the casts, every 61st scale) float16.
    #[test]
    fn fused_rounding_matches_the_scalar_rounding_for_every_scale() {
        let multipliers: Vec<f32> = (-255..=255).map(|m| m as f32).collect();
        for sd in [DType::F16, DType::BF16, DType::F32] {
            let scales: Vec<f32> = (0..=u16::MAX)
                .map(|b| match sd {
                    DType::F16 => half::f16::from_bits(b).to_f32(),
                    DType::BF16 => half::bf16::from_bits(b).to_f32(),
                    _ => f32::from_bits(u32::from(b) << 16 | u32::from(b)),
                })
                .filter(|s| s.is_finite())
                .collect();
            for to in [DType::BF16, DType::F32, DType::F16] {
                let size = to.size() as usize;
                let (mut floats, mut rounded) = (Vec::new(), Vec::new());
                let mut output = vec![0u8; multipliers.len() * size];
                let step = if to == DType::F16 { 61 } else { 1 };
                for &s in scales.iter().step_by(step) {
                    let products: Vec<f32> = multipliers.iter().map(|m| m * s).collect();
                    round_products(&products, sd, to, (&mut floats, &mut rounded), &mut output);
                    for (p, o) in products.iter().zip(output.chunks_exact(size)) {
                        let mut got = [0u8; 4];
                        got[..size].copy_from_slice(o);
                        assert_eq!(
                            u32::from_le_bytes(got),
                            output_bits(*p, sd, to),
                            "{p:e} (scale {s:e}) in {sd} to {to}"
                        );
                    }
                }
            }
        }
    }

    /// [`expand_nibbles_shuffled`] from a caller compiled for AVX2, as the dequantizers
    /// call it; true when that path ran.
    #[multiversion::multiversion(targets("x86_64+avx2"))]
    fn shuffled(bytes: &[u8], table: &[[u8; 2]; 16], dst: &mut [u8]) -> bool {
        multiversion::target::match_target! {
            "x86_64+avx2" => {
                expand_nibbles_shuffled(bytes, table, dst);
                true
            }
            _ => {
                expand_nibbles(bytes, table, dst);
                false
            }
        }
    }

    /// [`crate::save::avx512::expand_nibbles_words`] and the plain loop after it, from
    /// a caller compiled for AVX-512, as GPTQ's rows call it; true when that path ran.
    #[multiversion::multiversion(targets("x86_64+avx512f+avx512bw"))]
    fn permuted(bytes: &[u8], table: &[[u8; 2]; 16], dst: &mut [u8]) -> bool {
        multiversion::target::match_target! {
            "x86_64+avx512f+avx512bw" => {
                let done = crate::save::avx512::expand_nibbles_words(bytes, table, dst);
                expand_nibbles(&bytes[done..], table, &mut dst[done * 4..]);
                true
            }
            _ => {
                expand_nibbles(bytes, table, dst);
                false
            }
        }
    }

    /// A nibble expansion under test: true when its vector path ran.
    type Expansion = fn(&[u8], &[[u8; 2]; 16], &mut [u8]) -> bool;

    #[test]
    fn shuffled_expansion_writes_what_the_plain_one_writes() {
        let table: [[u8; 2]; 16] =
            std::array::from_fn(|v| [(v * 37 + 11) as u8, (v * 91 + 200) as u8]);
        // Every byte value, and lengths around the 16-byte step.
        for len in [0usize, 1, 15, 16, 17, 31, 64, 100, 256, 259] {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 73 + 5) as u8).collect();
            let mut want = vec![0u8; len * 4];
            expand_nibbles(&bytes, &table, &mut want);
            // Each vector path, and whether the CPU has what it needs (so it ran).
            #[cfg(target_arch = "x86_64")]
            let has = [
                std::is_x86_feature_detected!("avx2"),
                std::is_x86_feature_detected!("avx512bw"),
            ];
            #[cfg(not(target_arch = "x86_64"))]
            let has = [false, false];
            let paths: [(Expansion, &str); 2] =
                [(shuffled, "byte shuffles"), (permuted, "word permutes")];
            for ((expand, how), has) in paths.into_iter().zip(has) {
                let mut got = vec![0u8; len * 4];
                let ran = expand(&bytes, &table, &mut got);
                assert_eq!(got, want, "{len} bytes, by {how}");
                assert_eq!(ran, has, "{how} ran where the CPU has them");
            }
        }
    }
}
