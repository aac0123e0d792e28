//! GPTQ at 8 bits, and at 4 in act order: output rows made straight from the packed
//! words as read, sixteen at a time, each value computed (`(q − z) · s`, rounded and
//! converted) rather than looked up. The packed words are not transposed into the
//! band's columns first, and an input's group costs a load of its zero points and
//! scales, not a table lookup per value: act order runs as fast as order.

use std::fs::File;

use super::band::{Decode, Groups, TILE_ROWS, copy_in_lines};
use super::kernels::{words_to_rows, words_to_rows_in_vectors};
use super::{Packing, TransposedIntLayout};
use crate::save::copy::{CopyError, read_exact_at, resize_exact};
use crate::save::lookup::output_bits;
use crate::types::DType;

/// Output rows a vector kernel makes at a time (a lane each), and the read band's
/// columns in a block.
const LANES: usize = 16;

/// The bytes [`read_in_blocks`] lays `words` columns of `rows` packed rows out in.
pub(super) fn blocks_bytes(rows: usize, words: usize) -> usize {
    words.div_ceil(LANES) * rows * LANES * 4
}

/// The bytes the packed rows read before they are dealt to the blocks may take at most
/// ([`TILE_ROWS`] of them where they fit): a band of few packed rows has long ones, and
/// sixteen would be most of the band again. In unit tests a few hundred bytes, so both
/// counts are met.
const TILE_BYTES: usize = if cfg!(test) { 512 } else { 256 << 10 };

/// Reads `words` columns of each of `rows` packed rows (row `r`'s at byte `at(r)` of
/// `src`, one read each, into `row`) into `packed` in blocks of sixteen columns: block
/// `b`'s words of every packed row in a run, 64 bytes a row (fewer words in a last,
/// partial block), so the kernel reads each block's rows in order, not 64 bytes of
/// every packed row of a read band too large for the cache. Sixteen rows are read
/// (fewer where they are long), then dealt, a block's 1 KiB at a time: dealt after each
/// read, an 8-bit save spent 150 samples in the next read's first step (`fdget`) and
/// 13 so, 6% less CPU in all (Xeon VM; a read that follows stores to 32 lines apart
/// waits for them, it seems). (A `preadv` dealing the row to the blocks itself cost
/// more: the kernel's copy slows on buffers of 64 bytes, 3.7 times the samples in that
/// copy.)
pub(super) fn read_in_blocks(
    src: &File,
    (packed, row): (&mut [u8], &mut Vec<u8>),
    (rows, at): (usize, impl Fn(usize) -> u64),
    words: usize,
) -> Result<(), CopyError> {
    let region = rows * LANES * 4;
    let row_bytes = words * 4;
    let tile_rows = (TILE_BYTES / row_bytes.max(1)).clamp(1, TILE_ROWS);
    resize_exact(row, tile_rows * row_bytes, 0);
    for r0 in (0..rows).step_by(tile_rows) {
        let count = tile_rows.min(rows - r0);
        for (t, dst) in row.chunks_exact_mut(row_bytes).take(count).enumerate() {
            read_exact_at(src, dst, at(r0 + t))?;
        }
        for (b, block) in packed.chunks_exact_mut(region).enumerate() {
            let from = b * LANES * 4;
            let len = (LANES * 4).min(row_bytes - from);
            for t in 0..count {
                let (to, from) = ((r0 + t) * LANES * 4, t * row_bytes + from);
                copy_in_lines(&mut block[to..to + len], &row[from..from + len]);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
thread_local! {
    /// Tests' way to take the band's columns on a CPU that has the vector kernel, so
    /// both paths are checked on one machine.
    pub(super) static COLUMNS_ONLY: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether a weight's rows are made from its words as read: GPTQ at 8 bits or at 4 in
/// act order (4 bits in order look a group's 16 outputs up faster), the dtypes the
/// kernel rounds to, on a CPU that runs it. (8 bits in order took the band's columns
/// until this path gathered each block's zero points and scales: transposing the words
/// into the columns and computing each value from there cost 1,800 samples of a save
/// where dealing the words and this kernel cost 1,400; Xeon VM.)
pub(super) fn rows_from_words(layout: TransposedIntLayout, groups: &Groups, to: DType) -> bool {
    #[cfg(test)]
    if COLUMNS_ONLY.with(std::cell::Cell::get) {
        return false;
    }
    let float = |d: DType| matches!(d, DType::F16 | DType::BF16 | DType::F32);
    matches!(layout.packing, Packing::Gptq { .. })
        && matches!(layout.bits, 4 | 8)
        && (layout.bits == 8 || !groups.in_order)
        && float(layout.scale_dtype)
        && float(to)
        && words_to_rows_in_vectors()
}

/// The zero points and scales of sixteen output rows, `[groups, 16]`: what the vector
/// kernel loads for each input, by its group. In the read band's `[groups, read_n]` a
/// group's are `read_n` apart, 2 KiB for a band of 512 rows: every group's fell in the
/// same two sets of the first-level cache, so in act order, where each input has a
/// group of its own, nearly every load missed it.
#[derive(Default)]
pub(super) struct BlockParams {
    zeros: Vec<i32>,
    scales: Vec<f32>,
}

impl BlockParams {
    /// Columns `col..col + LANES` of every group of `zeros` and `scales` (`[groups,
    /// read_n]`).
    fn gather(&mut self, (zeros, scales, read_n): (&[i32], &[f32], usize), col: usize) {
        let groups = zeros.len() / read_n.max(1);
        self.zeros.clear();
        self.scales.clear();
        for g in 0..groups {
            let at = g * read_n + col;
            self.zeros.extend_from_slice(&zeros[at..at + LANES]);
            self.scales.extend_from_slice(&scales[at..at + LANES]);
        }
    }
}

impl Decode<'_> {
    /// Output rows `first..first + count` of the sub-band from the read band's packed
    /// rows as read, into `output` (`count` rows of `SIZE`-byte elements of `to`): whole
    /// sixteens of rows 32 inputs at a time by the vector kernel (their zero points and
    /// scales gathered into `block_params` first), the rest value by value (the same
    /// arithmetic: [`output_bits`] of each product).
    pub(super) fn rows_from_words<const SIZE: usize>(
        &self,
        to: DType,
        (first, count): (usize, usize),
        block_params: &mut BlockParams,
        output: &mut [u8],
    ) {
        let layout = self.layout;
        let inputs = layout.inputs as usize;
        let (zeros, scales, read_n, _) = self.params;
        let (sd, of) = (layout.scale_dtype, self.groups.of.as_slice());
        let per = layout.per_word() as usize;
        let bits = u32::from(layout.bits);
        let mask = (1u32 << bits) - 1;
        let end = first + count;
        // Packed row p's word of read band column c (`read_in_blocks`' layout).
        let region = inputs / per * LANES;
        let word_at = |p: usize, c: usize| self.packed[c / LANES * region + p * LANES + c % LANES];
        for block in (first..end).step_by(LANES) {
            let width = LANES.min(end - block);
            let rows = (block - first) * inputs * SIZE..(block - first + width) * inputs * SIZE;
            let out = &mut output[rows];
            // The block's first column in the read band (and among its parameters).
            let col = self.skip + block;
            let done = if width == LANES && col.is_multiple_of(LANES) {
                block_params.gather((zeros, scales, read_n), col);
                let params = (&block_params.zeros[..], &block_params.scales[..], LANES, 0);
                words_to_rows::<SIZE>(
                    (&self.packed[col / LANES * region..], LANES, 0),
                    (bits, of),
                    params,
                    (sd, to),
                    out,
                )
            } else {
                0
            };
            for (k, row) in out.chunks_exact_mut(inputs * SIZE).enumerate() {
                let c = col + k;
                for i in done..inputs {
                    let word = u32::from_le_bytes(word_at(i / per, c));
                    let q = (word >> ((i % per) as u32 * bits)) & mask;
                    let at = of[i] as usize * read_n + c;
                    let product = (q as i32 - zeros[at]) as f32 * scales[at];
                    let value = output_bits(product, sd, to).to_le_bytes();
                    row[i * SIZE..(i + 1) * SIZE].copy_from_slice(&value[..SIZE]);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{LANES, words_to_rows, words_to_rows_in_vectors};
    use crate::save::lookup::output_bits;
    use crate::types::DType;

    /// The vector kernel's bits are [`output_bits`]' for every pair of dtypes it takes,
    /// at 4 and 8 bits, each input in a group of its own choosing (act order): scales
    /// from float16's subnormals to past its range (products that round to infinity),
    /// bfloat16 and float32 scales whose products lose bits, every code and zero
    /// point. On a CPU with AVX-512 it must do every input; elsewhere it does none.
    #[test]
    fn vector_rows_round_as_the_scalar_rounding_for_every_dtype() {
        let (inputs, groups) = (96usize, 5usize);
        let scale_of =
            |g: usize, c: usize| [6.0e-8, 3.1e-5, 0.0123, 7.77, 9000.0][g] * (1.0 + c as f32 / 7.0);
        for bits in [4u32, 8] {
            let per = (32 / bits) as usize;
            let mask = (1u32 << bits) - 1;
            // Packed row p, column c: any word.
            let packed: Vec<[u8; 4]> = (0..inputs / per * LANES)
                .map(|k| {
                    (k as u32)
                        .wrapping_mul(0x9E37_79B9)
                        .rotate_left(7)
                        .to_le_bytes()
                })
                .collect();
            let of: Vec<u32> = (0..inputs)
                .map(|i| ((i * 7 + i / 3) % groups) as u32)
                .collect();
            let zeros: Vec<i32> = (0..groups * LANES)
                .map(|k| ((k * 37) as u32 & mask) as i32)
                .collect();
            for sd in [DType::F16, DType::BF16, DType::F32] {
                let round = |x: f32| f32::from_bits(output_bits(x, sd, DType::F32));
                let scales: Vec<f32> = (0..groups * LANES)
                    .map(|k| round(scale_of(k / LANES, k % LANES)))
                    .collect();
                for to in [DType::BF16, DType::F16, DType::F32] {
                    let size = to.size() as usize;
                    let mut output = vec![0u8; LANES * inputs * size];
                    let params = (zeros.as_slice(), scales.as_slice(), LANES, 0);
                    let dtypes = (sd, to);
                    let words = (packed.as_slice(), LANES, 0);
                    let done = if size == 2 {
                        words_to_rows::<2>(words, (bits, &of), params, dtypes, &mut output)
                    } else {
                        words_to_rows::<4>(words, (bits, &of), params, dtypes, &mut output)
                    };
                    let want = if words_to_rows_in_vectors() {
                        inputs
                    } else {
                        0
                    };
                    assert_eq!(done, want, "{bits} bits, {sd} scales to {to}");
                    for (k, row) in output.chunks_exact(inputs * size).enumerate() {
                        for i in 0..done {
                            let word = u32::from_le_bytes(packed[i / per * LANES + k]);
                            let q = (word >> ((i % per) as u32 * bits)) & mask;
                            let at = of[i] as usize * LANES + k;
                            let product = (q as i32 - zeros[at]) as f32 * scales[at];
                            let mut got = [0u8; 4];
                            got[..size].copy_from_slice(&row[i * size..(i + 1) * size]);
                            assert_eq!(
                                u32::from_le_bytes(got),
                                output_bits(product, sd, to),
                                "{bits} bits, {sd} scales to {to}: row {k}, input {i}, {product:e}"
                            );
                        }
                    }
                }
            }
        }
    }
}
