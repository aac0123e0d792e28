//! The vector kernels of a band's 4-bit values: AWQ's 8×8 nibble transposition and the
//! expansion of a row's nibbles through its group's 16 outputs (both compiled for
//! AVX-512 and AVX2 too, chosen at run time).

use crate::save::lookup::{dequantize_bytes, expand_nibbles, round_products};
use crate::types::DType;

/// AWQ's 4-bit words (`packed`, `band_words` a row, the sub-band's from `first_word`)
/// transposed into each output row's nibbles in input order (`columns`, a row every
/// `stride` bytes), 8×8 values at a time: eight input rows' words hold eight output
/// columns, the one at nibble `p` being column `column_at[p]` of the eight. The 8×8
/// nibbles are transposed in three rounds of swaps (nibbles, then pairs, then fours):
/// fixed shifts and masks, eight blocks side by side (a vector lane each), and two
/// blocks down the input rows at once, so each output row gets 8 bytes a store.
/// Compiled for AVX-512 and AVX2 too and chosen at run time.
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512vl+avx2+fma",
    "x86_64+avx2+fma",
    "aarch64+neon"
))]
pub(super) fn awq_columns(
    (packed, band_words, first_word): (&[[u8; 4]], usize, usize),
    (inputs, n): (usize, usize),
    column_at: [usize; 8],
    (columns, stride): (&mut [u8], usize),
) {
    let blocks = n / 8;
    let lanes = blocks - blocks % 8;
    let mut i0 = 0;
    while i0 < inputs {
        let at = i0 * band_words + first_word;
        let place = (stride, column_at, i0);
        if i0 + 16 <= inputs {
            for j0 in (0..lanes).step_by(8) {
                transpose_blocks::<8, 2>((packed, band_words, at + j0), columns, place, j0);
            }
            for j in lanes..blocks {
                transpose_blocks::<1, 2>((packed, band_words, at + j), columns, place, j);
            }
            i0 += 16;
        } else {
            for j0 in (0..lanes).step_by(8) {
                transpose_blocks::<8, 1>((packed, band_words, at + j0), columns, place, j0);
            }
            for j in lanes..blocks {
                transpose_blocks::<1, 1>((packed, band_words, at + j), columns, place, j);
            }
            i0 += 8;
        }
    }
}

/// [`awq_columns`]' `L` blocks side by side and `R` down, from word `at` (input rows
/// `i0..i0 + 8R`, output columns from `8 · j0`) on. Always inlined: called from the
/// multiversioned loop, a call would run at the baseline's vector width.
#[inline(always)]
#[allow(clippy::inline_always)]
fn transpose_blocks<const L: usize, const R: usize>(
    (packed, band_words, at): (&[[u8; 4]], usize, usize),
    columns: &mut [u8],
    (stride, column_at, i0): (usize, [usize; 8], usize),
    j0: usize,
) {
    let mut w = [[[0u32; L]; 8]; R];
    for (r, block) in w.iter_mut().enumerate() {
        for (t, row) in block.iter_mut().enumerate() {
            let from = at + (r * 8 + t) * band_words;
            let words: &[[u8; 4]; L] = packed[from..from + L]
                .try_into()
                .unwrap_or_else(|_| unreachable!("a slice of L words"));
            *row = words.map(u32::from_le_bytes);
        }
    }
    // Rows a < b: b's low parts and a's high parts change places.
    let swap = |w: &mut [[u32; L]; 8], (a, b): (usize, usize), shift: u32, mask: u32| {
        let (before, from_b) = w.split_at_mut(b);
        for (x, y) in before[a].iter_mut().zip(from_b[0].iter_mut()) {
            let d = ((*x >> shift) ^ *y) & mask;
            *y ^= d;
            *x ^= d << shift;
        }
    };
    for block in &mut w {
        for t in [0, 2, 4, 6] {
            swap(block, (t, t + 1), 4, 0x0F0F_0F0F);
        }
        for t in [0, 1, 4, 5] {
            swap(block, (t, t + 2), 8, 0x00FF_00FF);
        }
        for t in [0, 1, 2, 3] {
            swap(block, (t, t + 4), 16, 0x0000_FFFF);
        }
    }
    // Word p of each block now holds nibble p of each of its eight input rows, in
    // order; the R blocks' words of one output row lie side by side.
    for (p, &column) in column_at.iter().enumerate() {
        // (Indexed: a lane's words are gathered across the R blocks.)
        #[allow(clippy::needless_range_loop)]
        for lane in 0..L {
            let at = ((j0 + lane) * 8 + column) * stride + i0 / 2;
            let dst = &mut columns[at..at + 4 * R];
            for (r, out) in dst.chunks_exact_mut(4).enumerate() {
                out.copy_from_slice(&w[r][p][lane].to_le_bytes());
            }
        }
    }
}

/// Output rows `first..first + count` of a sub-band of rows of `inputs` values, from
/// their 4-bit values in input order (row `first + k`'s at `columns[k · stride..]`),
/// each group of `group` inputs expanded through its 16 outputs (`tables[row · groups +
/// g]`), into `output` (row `first + k` at `k · inputs` values).
/// Compiled for AVX-512 and AVX2 too, chosen at run time (table lookups and stores: the
/// same bytes on every path).
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512vl+avx2+fma",
    "x86_64+avx2+fma",
    "aarch64+neon"
))]
pub(super) fn expand_rows<const SIZE: usize>(
    (columns, stride): (&[u8], usize),
    (first, count): (usize, usize),
    (groups, inputs, group): (usize, usize, usize),
    tables: &[[[u8; SIZE]; 16]],
    output: &mut [u8],
) {
    for k in 0..count {
        let local = first + k;
        let column = &columns[k * stride..k * stride + inputs / 2];
        let row = &mut output[k * inputs * SIZE..(k + 1) * inputs * SIZE];
        let runs = column.chunks(group / 2);
        let dsts = row.chunks_mut(group * SIZE);
        for (g, (bytes, dst)) in runs.zip(dsts).enumerate() {
            let table = &tables[local * groups + g];
            multiversion::target::match_target! {
                "x86_64+avx512f+avx512bw" => {
                    let done = crate::save::avx512::expand_nibbles_words(bytes, table, dst);
                    expand_nibbles(&bytes[done..], table, &mut dst[done * 2 * SIZE..]);
                }
                "x86_64+avx2" => crate::save::lookup::expand_nibbles_shuffled(bytes, table, dst),
                _ => expand_nibbles(bytes, table, dst),
            }
        }
    }
}

/// One output row of 8-bit values (`bytes`, in input order) dequantized into `output`
/// (`to`, after rounding to the scale's dtype `sd`): with the groups in order and a
/// bfloat16 or float32 output, each group's values in one vectorised pass; else their
/// products ([`byte_products`]), rounded and converted.
pub(super) fn byte_row(
    bytes: &[u8],
    (of, size): (Option<&[u32]>, usize),
    params: &[(i32, f32)],
    (sd, to): (DType, DType),
    (products, floats, rounded): (&mut Vec<f32>, &mut Vec<u8>, &mut Vec<u8>),
    output: &mut [u8],
) {
    let size = size.max(1);
    let per_group = bytes
        .chunks(size)
        .zip(output.chunks_mut(size * to.size() as usize));
    if of.is_none()
        && per_group
            .zip(params)
            .all(|((q, o), &zs)| dequantize_bytes(q, zs, (sd, to), o))
    {
        return;
    }
    products.resize(bytes.len(), 0.0);
    byte_products(bytes, (of, size), params, products);
    round_products(products, sd, to, (floats, rounded), output);
}

/// 8-bit values (a byte each, in input order) as `(q − z) · s` in f32 (exact: a 9-bit
/// integer times a scale of at most 11 significant bits, or one rounding for a float32
/// scale, as torch's product in that dtype) into `products`: value `i` in group `of[i]`
/// where `of` is given (act order), else `i / size`; `params[g]` group `g`'s zero point
/// and scale.
fn byte_products(
    bytes: &[u8],
    (of, size): (Option<&[u32]>, usize),
    params: &[(i32, f32)],
    products: &mut [f32],
) {
    match of {
        None => {
            let groups = bytes
                .chunks(size.max(1))
                .zip(products.chunks_mut(size.max(1)));
            for ((values, dst), &(z, s)) in groups.zip(params) {
                for (q, p) in values.iter().zip(dst) {
                    *p = (i32::from(*q) - z) as f32 * s;
                }
            }
        }
        Some(of) => {
            for ((q, g), p) in bytes.iter().zip(of).zip(products.iter_mut()) {
                let (z, s) = params[*g as usize];
                *p = (i32::from(*q) - z) as f32 * s;
            }
        }
    }
}

/// `count` packed rows of a read band (`rows`: row `t`'s `row_words` words at
/// `rows[t · row_words..]`) into the band's columns: word `c` of row `t` to
/// `columns[c · stride + 4 · t..]`, so each output row's packed words lie in input
/// order. Tiles of sixteen rows by sixteen columns by a register transposition on
/// AVX-512; the columns and rows past the last whole tiles word by word.
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512vl+avx2+fma",
    "x86_64+avx2+fma",
    "aarch64+neon"
))]
pub(super) fn transpose_into_columns(
    rows: &[[u8; 4]],
    (row_words, count): (usize, usize),
    (columns, stride): (&mut [u8], usize),
) {
    let rows = &rows[..row_words * count];
    let (rows_done, columns_done) = multiversion::target::match_target! {
        "x86_64+avx512f" => crate::save::avx512::transpose_rows(rows, row_words, (columns, stride)),
        _ => (0, 0),
    };
    for t in 0..count {
        // The tiles' rows lack only the columns past the last tile.
        let first = if t < rows_done { columns_done } else { 0 };
        for (c, w) in rows[t * row_words + first..(t + 1) * row_words]
            .iter()
            .enumerate()
        {
            let b = (first + c) * stride + t * 4;
            columns[b..b + 4].copy_from_slice(w);
        }
    }
}

/// AWQ at 4 bits: the eight output rows of one packed word (`rows`, row `c` at
/// `c · inputs · SIZE`) from its word of each input (`words`, in input order, nibble
/// `s` row `column_at[s]`'s), each value looked up in its row's table of its group
/// (`tables[c · groups + g]`). Two rows a word permute on AVX-512 (bfloat16 and
/// float16: [`crate::save::avx512::awq_word_rows`]); the inputs past its whole
/// sixteens, and other CPUs, value by value.
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512vl+avx2+fma",
    "x86_64+avx2+fma",
    "aarch64+neon"
))]
pub(super) fn awq_word_rows<const SIZE: usize>(
    words: &[[u8; 4]],
    (tables, groups, group): (&[[[u8; SIZE]; 16]], usize, usize),
    column_at: [usize; 8],
    rows: &mut [u8],
) {
    let done = multiversion::target::match_target! {
        "x86_64+avx512f+avx512bw" => match (tables.as_flattened().as_flattened(), SIZE) {
            (flat, 2) => {
                let (two, _) = flat.as_chunks::<2>();
                let (tables_of_two, _) = two.as_chunks::<16>();
                crate::save::avx512::awq_word_rows(words, (tables_of_two, groups, group), column_at, rows)
            }
            _ => 0,
        },
        _ => 0,
    };
    let inputs = words.len();
    for (i, word) in words.iter().enumerate().skip(done) {
        let (w, g) = (u32::from_le_bytes(*word), i / group);
        for (s, &c) in column_at.iter().enumerate() {
            let value = ((w >> (4 * s)) & 0xF) as usize;
            let at = (c * inputs + i) * SIZE;
            rows[at..at + SIZE].copy_from_slice(&tables[c * groups + g][value]);
        }
    }
}

/// Whether this CPU runs [`words_to_rows`]' vector kernel (AVX-512): where it does not,
/// GPTQ's 8-bit and act-order weights take the band's columns instead.
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512vl+avx2+fma",
    "x86_64+avx2+fma",
    "aarch64+neon"
))]
pub(super) fn words_to_rows_in_vectors() -> bool {
    multiversion::target::match_target! {
        "x86_64+avx512f" => true,
        _ => false,
    }
}

/// Sixteen output rows from GPTQ's packed words as read, 32 inputs at a time by the
/// AVX-512 kernel ([`crate::save::avx512::words_to_rows`], whose `WordsToRows` says
/// what `words`, `of`, `params` and `output` hold). Returns the inputs done (none where
/// the CPU lacks AVX-512); the caller does the rest.
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512vl+avx2+fma",
    "x86_64+avx2+fma",
    "aarch64+neon"
))]
pub(super) fn words_to_rows<const SIZE: usize>(
    (packed, row_words, col): (&[[u8; 4]], usize, usize),
    (bits, of): (u32, &[u32]),
    (zeros, scales, read_n, param_col): (&[i32], &[f32], usize, usize),
    dtypes: (DType, DType),
    output: &mut [u8],
) -> usize {
    multiversion::target::match_target! {
        "x86_64+avx512f" => {
            let at = crate::save::avx512::WordsToRows {
                packed, row_words, col, of, zeros, scales, read_n, param_col, output,
            };
            crate::save::avx512::words_to_rows::<SIZE>(at, bits, dtypes)
        }
        _ => {
            let _ = (packed, row_words, col, bits, of, zeros, scales, read_n, param_col);
            let _ = (dtypes, output);
            0
        }
    }
}
