//! Kernels written with AVX-512 instructions (`std::arch`), for what the compiler does
//! not vectorise from plain loops: a 16×16 transposition of words, float16
//! rounding by the conversion instructions, and 4-bit values looked up in a table of
//! 16-bit outputs by a word permute (GPTQ's a row at a time, AWQ's two rows of a
//! packed word at a time). Each is called only from a
//! `multiversion` function's AVX-512 version (`match_target!`), which has the
//! features enabled, and does the part of its input that fills whole vectors: the
//! caller's plain loop does the rest, the same bytes either way.

use std::arch::x86_64::{
    __m128i, __m256i, __m512, __m512i, _mm_extract_epi64, _mm_set_epi64x, _mm256_extracti128_si256,
    _mm512_add_epi32, _mm512_and_si512, _mm512_castps_si512, _mm512_castsi512_ps,
    _mm512_cvtepi32_epi16, _mm512_cvtepi32_ps, _mm512_cvtepu8_epi32, _mm512_cvtepu16_epi32,
    _mm512_cvtph_ps, _mm512_cvtps_ph, _mm512_extracti32x4_epi32, _mm512_extracti64x4_epi64,
    _mm512_mul_ps, _mm512_or_si512, _mm512_permutex2var_epi32, _mm512_permutexvar_epi16,
    _mm512_set_epi32, _mm512_set_epi64, _mm512_set1_epi32, _mm512_set1_ps, _mm512_setzero_si512,
    _mm512_slli_epi32, _mm512_srl_epi16, _mm512_srli_epi32, _mm512_srlv_epi32, _mm512_sub_epi32,
};

use crate::types::DType;

/// Sixteen `i32`s as a vector, lane `k` from `$lane(k)` (a closure): the one place the
/// sixteen lanes are spelled out, for [`vector`] and [`load_words!`] alike.
macro_rules! lanes {
    ($lane:expr) => {{
        let lane = $lane;
        _mm512_set_epi32(
            lane(15),
            lane(14),
            lane(13),
            lane(12),
            lane(11),
            lane(10),
            lane(9),
            lane(8),
            lane(7),
            lane(6),
            lane(5),
            lane(4),
            lane(3),
            lane(2),
            lane(1),
            lane(0),
        )
    }};
}

/// Sixteen `i32`s as a vector, element `k` from `x(k)`.
#[inline]
#[target_feature(enable = "avx512f")]
fn vector(x: impl Fn(usize) -> i32) -> __m512i {
    lanes!(x)
}

/// A 128-bit vector's 16 bytes into `out` (a `&mut [u8]`), little-endian. A macro, as
/// the stores below are, so it is always inlined: a function with `target_feature`
/// cannot be `#[inline(always)]`, and LLVM left `store_512` out of line (a call, the
/// vector spilled to the stack) once it had more callers.
macro_rules! store_128 {
    ($v:expr, $out:expr) => {{
        let (v, out): (__m128i, &mut [u8]) = ($v, $out);
        out[..8].copy_from_slice(&_mm_extract_epi64::<0>(v).to_le_bytes());
        out[8..16].copy_from_slice(&_mm_extract_epi64::<1>(v).to_le_bytes());
    }};
}

/// Sixteen little-endian words (`&[[u8; 4]]`, at least 16) as a vector, word `k` in
/// lane `k` (one 64-byte load once compiled; a macro, so no closure is left out of
/// line).
macro_rules! load_words {
    ($words:expr) => {{
        let w: &[[u8; 4]] = $words;
        lanes!(|k: usize| i32::from_le_bytes(w[k]))
    }};
}

/// A vector's 64 bytes into `out`, little-endian (one 64-byte store once compiled).
macro_rules! store_512 {
    ($v:expr, $out:expr) => {{
        let (v, out): (__m512i, &mut [u8]) = ($v, $out);
        store_128!(_mm512_extracti32x4_epi32::<0>(v), &mut out[..16]);
        store_128!(_mm512_extracti32x4_epi32::<1>(v), &mut out[16..32]);
        store_128!(_mm512_extracti32x4_epi32::<2>(v), &mut out[32..48]);
        store_128!(_mm512_extracti32x4_epi32::<3>(v), &mut out[48..64]);
    }};
}

/// A 256-bit vector's 32 bytes into `out`, little-endian.
macro_rules! store_256 {
    ($v:expr, $out:expr) => {{
        let (v, out): (__m256i, &mut [u8]) = ($v, $out);
        store_128!(_mm256_extracti128_si256::<0>(v), &mut out[..16]);
        store_128!(_mm256_extracti128_si256::<1>(v), &mut out[16..32]);
    }};
}

/// The permutes of [`transpose!`]'s four rounds (d = 8, 4, 2, 1): entry j < 16 takes
/// row a's element j, 16 + j row a + d's.
#[inline]
#[target_feature(enable = "avx512f")]
fn transpose_rounds() -> [(__m512i, __m512i); 4] {
    let indices = |d: usize| {
        (
            vector(|j| (if j & d == 0 { j } else { 16 + (j ^ d) }) as i32),
            vector(|j| (if j & d == 0 { j ^ d } else { 16 + j }) as i32),
        )
    };
    [indices(8), indices(4), indices(2), indices(1)]
}

/// One two-source permute pair of [`transpose!`]: vectors `$a` and `$b` of `$m` become
/// the permutes `$low` and `$high` of the two.
macro_rules! permute_pair {
    ($m:expr, $a:literal, $b:literal, $low:expr, $high:expr) => {{
        let (x, y) = ($m[$a], $m[$b]);
        $m[$a] = _mm512_permutex2var_epi32(x, $low, y);
        $m[$b] = _mm512_permutex2var_epi32(x, $high, y);
    }};
}

/// 16 vectors of 16 `u32`s (`$m`, an array) transposed in place (vector `k` becomes
/// what was element `k` of each), with [`transpose_rounds`]' permutes (`$rounds`): four
/// rounds of two-source permutes; in each pair of vectors `a` and `a + d` (bit `d` of
/// `a` clear), `a`'s elements with bit `d` of their index set trade places with
/// `a + d`'s without. A macro, so it is inlined into the kernel that calls it (a
/// function with AVX-512 enabled cannot be marked always-inline, and one call a tile
/// of the 16 vectors through memory cost a tenth of the run); and the 32 pairs written
/// out with constant indices, so `$m` lives in registers (as loops over the rounds
/// and pairs, the compiler kept the array on the stack: a load and a store a permute).
macro_rules! transpose {
    ($m:expr, $rounds:expr) => {{
        let [(l8, h8), (l4, h4), (l2, h2), (l1, h1)] = $rounds;
        permute_pair!($m, 0, 8, l8, h8);
        permute_pair!($m, 1, 9, l8, h8);
        permute_pair!($m, 2, 10, l8, h8);
        permute_pair!($m, 3, 11, l8, h8);
        permute_pair!($m, 4, 12, l8, h8);
        permute_pair!($m, 5, 13, l8, h8);
        permute_pair!($m, 6, 14, l8, h8);
        permute_pair!($m, 7, 15, l8, h8);
        permute_pair!($m, 0, 4, l4, h4);
        permute_pair!($m, 1, 5, l4, h4);
        permute_pair!($m, 2, 6, l4, h4);
        permute_pair!($m, 3, 7, l4, h4);
        permute_pair!($m, 8, 12, l4, h4);
        permute_pair!($m, 9, 13, l4, h4);
        permute_pair!($m, 10, 14, l4, h4);
        permute_pair!($m, 11, 15, l4, h4);
        permute_pair!($m, 0, 2, l2, h2);
        permute_pair!($m, 1, 3, l2, h2);
        permute_pair!($m, 4, 6, l2, h2);
        permute_pair!($m, 5, 7, l2, h2);
        permute_pair!($m, 8, 10, l2, h2);
        permute_pair!($m, 9, 11, l2, h2);
        permute_pair!($m, 12, 14, l2, h2);
        permute_pair!($m, 13, 15, l2, h2);
        permute_pair!($m, 0, 1, l1, h1);
        permute_pair!($m, 2, 3, l1, h1);
        permute_pair!($m, 4, 5, l1, h1);
        permute_pair!($m, 6, 7, l1, h1);
        permute_pair!($m, 8, 9, l1, h1);
        permute_pair!($m, 10, 11, l1, h1);
        permute_pair!($m, 12, 13, l1, h1);
        permute_pair!($m, 14, 15, l1, h1);
    }};
}

/// Rows of words (`rows`: row `t` at `rows[t · row_words..]`, `rows.len() / row_words`
/// of them) transposed sixteen rows by sixteen columns at a time ([`transpose!`]) into
/// `columns`: word `c` of row `t` goes to `columns[c · stride + 4 · t..]`. Each tile of
/// columns takes every tile of rows before the next, so a column's words go out in
/// one run. Returns the rows and the columns done (whole tiles of each).
#[target_feature(enable = "avx512f")]
pub(crate) fn transpose_rows(
    rows: &[[u8; 4]],
    row_words: usize,
    (columns, stride): (&mut [u8], usize),
) -> (usize, usize) {
    let rounds = transpose_rounds();
    let row_tiles = rows.len() / row_words.max(1) / 16;
    let column_tiles = row_words / 16;
    for c0 in (0..column_tiles).map(|c| c * 16) {
        for r0 in (0..row_tiles).map(|r| r * 16) {
            // A loop, not `array::from_fn`: its closure was left out of line (a call a
            // row of the tile).
            let mut m = [_mm512_setzero_si512(); 16];
            for (t, v) in m.iter_mut().enumerate() {
                let at = (r0 + t) * row_words + c0;
                *v = load_words!(&rows[at..at + 16]);
            }
            transpose!(m, rounds);
            for (k, column) in m.iter().enumerate() {
                let b = (c0 + k) * stride + r0 * 4;
                store_512!(*column, &mut columns[b..b + 64]);
            }
        }
    }
    (row_tiles * 16, column_tiles * 16)
}

/// Each byte of `bytes` as two 2-byte outputs (`SIZE` 2; the low nibble's first),
/// looked up in `table` by one word permute (`vpermw`) a 16-byte step: the bytes
/// widened to 32-bit lanes, each lane's two nibbles made its two 16-bit indices, the
/// 32 outputs stored as one vector. Returns the bytes done (whole sixteens; none for
/// another `SIZE`).
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) fn expand_nibbles_words<const SIZE: usize>(
    bytes: &[u8],
    table: &[[u8; SIZE]; 16],
    dst: &mut [u8],
) -> usize {
    if SIZE != 2 {
        return 0;
    }
    // Four entries a 64-bit lane, the table in the vector's low 32 bytes.
    let quad = |q: usize| {
        let entry = |v: usize| u64::from(u16::from_le_bytes([table[v][0], table[v][1]]));
        (entry(4 * q) | entry(4 * q + 1) << 16 | entry(4 * q + 2) << 32 | entry(4 * q + 3) << 48)
            as i64
    };
    let outputs = _mm512_set_epi64(0, 0, 0, 0, quad(3), quad(2), quad(1), quad(0));
    let (low, high) = (_mm512_set1_epi32(0x0F), _mm512_set1_epi32(0xF0));
    let (steps, _) = bytes.as_chunks::<16>();
    for (step, out) in steps.iter().zip(dst.chunks_exact_mut(64)) {
        let lanes = u128::from_le_bytes(*step);
        let wide = _mm512_cvtepu8_epi32(_mm_set_epi64x((lanes >> 64) as i64, lanes as i64));
        let indices = _mm512_or_si512(
            _mm512_and_si512(wide, low),
            _mm512_slli_epi32::<12>(_mm512_and_si512(wide, high)),
        );
        store_512!(_mm512_permutexvar_epi16(indices, outputs), out);
    }
    steps.len() * 16
}

/// 8-bit values of one group with a float16 scale `s` (zero point `z`): `(q − z) · s`
/// in f32 (exact: a 9-bit integer times 11 significant bits), rounded to float16 by
/// the conversion instruction (`vcvtps2ph`, to nearest even, overflow to infinity,
/// float16's subnormals as IEEE rounds them) and back, then written as bfloat16
/// (`SIZE` 2: rounded to nearest even on the bits; the values are float16's, so
/// finite or infinite, never NaN) or as float32 (`SIZE` 4). Returns the values done:
/// whole sixteens.
#[target_feature(enable = "avx512f")]
pub(crate) fn bytes_through_f16<const SIZE: usize>(
    bytes: &[u8],
    (z, s): (i32, f32),
    output: &mut [u8],
) -> usize {
    let (zero, scale) = (_mm512_set1_epi32(z), _mm512_set1_ps(s));
    let (steps, _) = bytes.as_chunks::<16>();
    for (step, out) in steps.iter().zip(output.chunks_exact_mut(16 * SIZE)) {
        let lanes = u128::from_le_bytes(*step);
        let q = _mm512_cvtepu8_epi32(_mm_set_epi64x((lanes >> 64) as i64, lanes as i64));
        let product = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(q, zero)), scale);
        let bits = through_f16::<SIZE>(product);
        if SIZE == 2 {
            store_256!(_mm512_cvtepi32_epi16(bits), out);
        } else {
            store_512!(bits, out);
        }
    }
    steps.len() * 16
}

/// Products rounded to float16 by the conversion instructions (`vcvtps2ph`, to nearest
/// even, overflow to infinity, float16's subnormals as IEEE rounds them) and back, as
/// float32 bits; then as the output's bits: bfloat16 (`SIZE` 2, in the low half, to
/// nearest even on the bits; float16's values are finite or infinite, never NaN) or
/// float32 (`SIZE` 4).
#[inline]
#[target_feature(enable = "avx512f")]
fn through_f16<const SIZE: usize>(product: __m512) -> __m512i {
    // 0x08: to nearest even, exceptions suppressed.
    let value = _mm512_castps_si512(_mm512_cvtph_ps(_mm512_cvtps_ph::<0x08>(product)));
    if SIZE == 2 {
        let lsb = _mm512_and_si512(_mm512_srli_epi32::<16>(value), _mm512_set1_epi32(1));
        let half_ulp = _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), lsb);
        _mm512_srli_epi32::<16>(_mm512_add_epi32(value, half_ulp))
    } else {
        value
    }
}

/// Where [`words_to_rows`] reads and writes: GPTQ's packed words as read (`packed`, a
/// packed row every `row_words` words, the sixteen output columns from word `col`, a
/// vector lane each); each input's group (`of`, one an input); the zero points and
/// scales (`[groups, read_n]`, the lanes' first at `param_col`); and the sixteen output
/// rows (`output`, `of.len()` values each).
pub(crate) struct WordsToRows<'a> {
    pub packed: &'a [[u8; 4]],
    pub row_words: usize,
    pub col: usize,
    pub of: &'a [u32],
    pub zeros: &'a [i32],
    pub scales: &'a [f32],
    pub read_n: usize,
    pub param_col: usize,
    pub output: &'a mut [u8],
}

/// The dtypes [`words_to_rows`] rounds through, as its constant parameters.
const F16: u8 = 0;
const BF16: u8 = 1;
const F32: u8 = 2;

/// GPTQ's packed words as read dequantized straight into sixteen output rows, 32
/// inputs at a time: each input's values unpacked by a shift, `(q − z) · s` in f32 with
/// its group's zero points and scales, rounded to the scale's dtype `sd` and converted
/// to `to` ([`output_lanes`]); the 32 inputs' outputs paired into words (`SIZE` 2) or
/// taken sixteen at a time (`SIZE` 4), and the 16×16 words transposed
/// ([`transpose!`]), so each output row gets 64 bytes a store. No table, no
/// transposition of the packed words: act order costs what order does. Returns the
/// inputs done (whole 32s; none for other widths and dtypes). The widths and dtypes
/// are made constants here, so the loop has no branch on them.
#[target_feature(enable = "avx512f")]
pub(crate) fn words_to_rows<const SIZE: usize>(
    at: WordsToRows<'_>,
    bits: u32,
    (sd, to): (DType, DType),
) -> usize {
    let code = |d: DType| match d {
        DType::F16 => Some(F16),
        DType::BF16 => Some(BF16),
        DType::F32 => Some(F32),
        _ => None,
    };
    let (Some(sd), Some(to)) = (code(sd), code(to)) else {
        return 0;
    };
    macro_rules! by_output {
        ($bits:literal, $sd:ident) => {
            match (SIZE, to) {
                (2, BF16) => rows_of::<2, $bits, $sd, BF16>(at),
                (2, F16) => rows_of::<2, $bits, $sd, F16>(at),
                (4, F32) => rows_of::<4, $bits, $sd, F32>(at),
                _ => 0,
            }
        };
    }
    macro_rules! by_scale {
        ($bits:literal) => {
            match sd {
                F16 => by_output!($bits, F16),
                BF16 => by_output!($bits, BF16),
                _ => by_output!($bits, F32),
            }
        };
    }
    match bits {
        4 => by_scale!(4),
        8 => by_scale!(8),
        _ => 0,
    }
}

/// [`words_to_rows`] for one width and pair of dtypes.
#[target_feature(enable = "avx512f")]
fn rows_of<const SIZE: usize, const BITS: u32, const SD: u8, const TO: u8>(
    at: WordsToRows<'_>,
) -> usize {
    let WordsToRows {
        packed,
        row_words,
        col,
        of,
        zeros,
        scales,
        read_n,
        param_col,
        output,
    } = at;
    let inputs = of.len();
    let per = (32 / BITS) as usize;
    let mask = _mm512_set1_epi32(((1u64 << BITS) - 1) as i32);
    let rounds = transpose_rounds();
    let chunks = inputs / 32;
    for i0 in (0..chunks).map(|c| c * 32) {
        // The chunk's packed rows: four at 4 bits, eight at 8.
        let mut words = [_mm512_setzero_si512(); 8];
        for (r, w) in words.iter_mut().take(32 / per).enumerate() {
            let at = (i0 / per + r) * row_words + col;
            *w = load_words!(&packed[at..at + 16]);
        }
        // Input i's sixteen outputs, as the output's bits (low half for `SIZE` 2).
        macro_rules! input {
            ($i:expr) => {{
                let i: usize = $i;
                let shift = _mm512_set1_epi32(((i % per) as u32 * BITS) as i32);
                let q = _mm512_and_si512(_mm512_srlv_epi32(words[(i - i0) / per], shift), mask);
                let at = of[i] as usize * read_n + param_col;
                let z: &[i32] = &zeros[at..at + 16];
                let s: &[f32] = &scales[at..at + 16];
                let zero = lanes!(|k: usize| z[k]);
                let scale = _mm512_castsi512_ps(lanes!(|k: usize| s[k].to_bits() as i32));
                let product = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(q, zero)), scale);
                output_lanes::<SD, TO>(product)
            }};
        }
        let mut m = [_mm512_setzero_si512(); 16];
        if SIZE == 2 {
            // Word p of a row: inputs 2p (low half) and 2p + 1.
            for (p, v) in m.iter_mut().enumerate() {
                let (low, high) = (input!(i0 + 2 * p), input!(i0 + 2 * p + 1));
                *v = _mm512_or_si512(low, _mm512_slli_epi32::<16>(high));
            }
            transpose!(m, rounds);
            for (k, row) in m.iter().enumerate() {
                let b = (k * inputs + i0) * 2;
                store_512!(*row, &mut output[b..b + 64]);
            }
        } else {
            for half in [0, 16] {
                for (t, v) in m.iter_mut().enumerate() {
                    *v = input!(i0 + half + t);
                }
                transpose!(m, rounds);
                for (k, row) in m.iter().enumerate() {
                    let b = (k * inputs + i0 + half) * 4;
                    store_512!(*row, &mut output[b..b + 64]);
                }
            }
        }
    }
    chunks * 32
}

/// Exact f32 products rounded to the scale's dtype `SD` (float16 by the conversion
/// instructions, bfloat16 to nearest even on the bits), then as `TO`'s bits: float32,
/// or bfloat16 (on the bits) or float16 (`vcvtps2ph`) in each lane's low half. The
/// products are finite or, past a dtype's range, infinite (never NaN: the scales are
/// checked finite), which both roundings carry through.
#[inline]
#[target_feature(enable = "avx512f")]
fn output_lanes<const SD: u8, const TO: u8>(product: __m512) -> __m512i {
    let to_bf16 = |bits: __m512i| {
        let lsb = _mm512_and_si512(_mm512_srli_epi32::<16>(bits), _mm512_set1_epi32(1));
        _mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), lsb))
    };
    // 0x08: to nearest even, exceptions suppressed.
    let value = match SD {
        F16 => _mm512_castps_si512(_mm512_cvtph_ps(_mm512_cvtps_ph::<0x08>(product))),
        BF16 => _mm512_and_si512(
            to_bf16(_mm512_castps_si512(product)),
            _mm512_set1_epi32(0xFFFF_0000_u32 as i32),
        ),
        _ => _mm512_castps_si512(product),
    };
    match TO {
        F16 => _mm512_cvtepu16_epi32(_mm512_cvtps_ph::<0x08>(_mm512_castsi512_ps(value))),
        BF16 => _mm512_srli_epi32::<16>(to_bf16(value)),
        _ => value,
    }
}

/// AWQ's eight output rows of one packed word at 4 bits (`SIZE` 2): `words` holds the
/// word of each input in input order, its nibble `s` row `column_at[s]`'s value; row
/// `c`'s 16 outputs in group `g` are `tables[c · groups + g]`. Sixteen inputs a step:
/// their words' 16-bit halves gathered by a word permute, low halves (nibbles 0–3)
/// first, so each shift by 4·s puts nibble `s` in the first sixteen lanes and nibble
/// `s + 4` in the last; each lane masked to its nibble (plus 16 in the last sixteen)
/// indexes a vector of the two rows' tables (`vpermw`), and each half of the result
/// is 32 bytes of one row. Rows go to `rows` (row `c` at `c · inputs · 2`). Returns
/// the inputs done: whole sixteens (none when a group is not whole sixteens).
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) fn awq_word_rows(
    words: &[[u8; 4]],
    (tables, groups, group): (&[[[u8; 2]; 16]], usize, usize),
    column_at: [usize; 8],
    rows: &mut [u8],
) -> usize {
    if group == 0 || !group.is_multiple_of(16) {
        return 0;
    }
    let inputs = words.len();
    // Word m of the permuted vector: the low half of input m (m < 16), else the high
    // half of input m − 16.
    let half = |m: usize| (if m < 16 { 2 * m } else { 2 * (m - 16) + 1 }) as i32;
    let halves = vector(|k| half(2 * k) | half(2 * k + 1) << 16);
    let nibble = _mm512_set1_epi32(0x000F_000F);
    let second = vector(|k| if k < 8 { 0 } else { 0x0010_0010 });
    // The two rows' tables of nibbles s and s + 4 in one vector, 16 entries each.
    let pair = |g: usize, s: usize| {
        let (a, b) = (
            &tables[column_at[s] * groups + g],
            &tables[column_at[s + 4] * groups + g],
        );
        let entry = |t: &[[u8; 2]; 16], v: usize| i32::from(u16::from_le_bytes(t[v]));
        vector(|k| {
            let t = if k < 8 { a } else { b };
            let v = 2 * (k % 8);
            entry(t, v) | entry(t, v + 1) << 16
        })
    };
    let steps = inputs / 16;
    // A pair of rows at a time over every input: two output runs and one input run
    // in flight (the eight rows at once, a multiple of 4 KiB apart, contended for the
    // same cache sets and stalled the stores).
    let shifts = [0, 4, 8, 12].map(|b| _mm_set_epi64x(0, b));
    for (s, shift) in shifts.into_iter().enumerate() {
        let mut table = _mm512_setzero_si512();
        let (a, b) = (column_at[s] * inputs, column_at[s + 4] * inputs);
        for step in 0..steps {
            let i0 = step * 16;
            if i0.is_multiple_of(group) {
                table = pair(i0 / group, s);
            }
            let v = _mm512_permutexvar_epi16(halves, load_words!(&words[i0..i0 + 16]));
            let x = _mm512_srl_epi16(v, shift);
            let index = _mm512_or_si512(_mm512_and_si512(x, nibble), second);
            let out = _mm512_permutexvar_epi16(index, table);
            let (a, b) = ((a + i0) * 2, (b + i0) * 2);
            store_256!(_mm512_extracti64x4_epi64::<0>(out), &mut rows[a..a + 32]);
            store_256!(_mm512_extracti64x4_epi64::<1>(out), &mut rows[b..b + 32]);
        }
    }
    steps * 16
}

#[cfg(test)]
mod tests {
    use crate::save::lookup::{dequantize_bytes, output_bits};
    use crate::types::DType;

    /// 8-bit values with a float16 scale, through whatever the CPU runs (on AVX-512,
    /// [`super::bytes_through_f16`] for whole sixteens): each value's bits are
    /// [`output_bits`]'s for its product, for every finite float16 scale (every 3rd
    /// bit pattern, the subnormals among them), every byte, zero points at both ends
    /// and between, to bfloat16 and float32; lengths with and without a tail past the
    /// last sixteen.
    #[test]
    fn bytes_with_float16_scales_round_as_the_scalar_rounding() {
        let bytes: Vec<u8> = (0..=255u8).chain(0..19).collect();
        for to in [DType::BF16, DType::F32] {
            let size = to.size() as usize;
            let mut output = vec![0u8; bytes.len() * size];
            for s in (0..=u16::MAX)
                .step_by(3)
                .map(|b| half::f16::from_bits(b).to_f32())
                .filter(|s| s.is_finite())
            {
                for z in [0, 1, 8, 128, 255] {
                    for len in [256, bytes.len()] {
                        let out = &mut output[..len * size];
                        assert!(dequantize_bytes(
                            &bytes[..len],
                            (z, s),
                            (DType::F16, to),
                            out
                        ));
                        for (q, o) in bytes[..len].iter().zip(out.chunks_exact(size)) {
                            let product = (i32::from(*q) - z) as f32 * s;
                            let mut got = [0u8; 4];
                            got[..size].copy_from_slice(o);
                            assert_eq!(
                                u32::from_le_bytes(got),
                                output_bits(product, DType::F16, to),
                                "q {q}, z {z}, scale {s:e} to {to}"
                            );
                        }
                    }
                }
            }
        }
    }
}
