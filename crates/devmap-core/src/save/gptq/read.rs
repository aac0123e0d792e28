//! Reading a read band ([`Shared`]): each packed row's words of the band's output
//! columns, laid out for the kernels (GPTQ's in columns or blocks, AWQ's dealt to the
//! sub-bands), and the band's zero points and scales, checked finite.

use super::band::{Params, Shared, TILE_ROWS, column_stride, gptq_in_columns};
use super::kernels::transpose_into_columns;
use super::{Packing, TransposedInt};
use crate::save::copy::{
    CopyError, invalid_data as invalid, line_aligned, read_exact_at, resize_exact,
};

impl Shared {
    /// Reads output columns `cols` of every packed row (each into `row` first), zero
    /// point and scale.
    pub(super) fn read(
        &mut self,
        input: &TransposedInt<'_>,
        cols: std::ops::Range<u64>,
        row: &mut Vec<u8>,
    ) -> Result<(), CopyError> {
        let layout = input.layout;
        let p = layout.per_word();
        let n = cols.end - cols.start;
        // Words of the band in a packed row, and the first.
        let (row_words, band_words, first_word, packed_rows) = match layout.packing {
            Packing::Gptq { .. } => (layout.outputs, n, cols.start, layout.inputs / p),
            Packing::Awq => (
                layout.outputs / p,
                n.div_ceil(p),
                cols.start / p,
                layout.inputs,
            ),
        };
        self.words_a_row = band_words as usize;
        // GPTQ's columns are laid out apart; the rows as read take this much.
        let as_read = (packed_rows * band_words * 4) as usize;
        // Where packed row `r`'s words of the band start.
        let at = |r: u64| input.qweight.1.offset + (r * row_words + first_word) * 4;
        match layout.packing {
            Packing::Gptq { .. } if self.from_words => {
                let rows = packed_rows as usize;
                let len = super::direct::blocks_bytes(rows, n as usize);
                self.start = line_aligned(&mut self.packed, len);
                let packed = &mut self.packed[self.start..self.start + len];
                let buffers = (packed, &mut *row);
                let at = |r: usize| at(r as u64);
                super::direct::read_in_blocks(input.qweight.0, buffers, (rows, at), n as usize)?;
            }
            Packing::Gptq { .. } if gptq_in_columns(layout) => {
                // Each packed row's words transposed into the band's columns (an
                // output row's packed words in input order), sixteen packed rows at
                // a time: the gather the sub-bands need, done once, from rows just
                // read, with no copy of the read band between.
                let (rows, words) = (packed_rows as usize, band_words as usize);
                let stride = column_stride(rows);
                self.start = line_aligned(&mut self.packed, words * stride);
                let packed = &mut self.packed[self.start..];
                resize_exact(row, TILE_ROWS * words * 4, 0);
                for r0 in (0..rows).step_by(TILE_ROWS) {
                    let count = TILE_ROWS.min(rows - r0);
                    let tile = row.chunks_exact_mut(words * 4).take(count);
                    for (t, dst) in tile.enumerate() {
                        read_exact_at(input.qweight.0, dst, at((r0 + t) as u64))?;
                    }
                    transpose_into_columns(
                        row.as_chunks::<4>().0,
                        (words, count),
                        (&mut packed[r0 * 4..], stride),
                    );
                }
            }
            Packing::Gptq { .. } => {
                self.start = line_aligned(&mut self.packed, as_read);
                for (r, dst) in self.packed[self.start..self.start + as_read]
                    .chunks_exact_mut((band_words * 4) as usize)
                    .enumerate()
                {
                    read_exact_at(input.qweight.0, dst, at(r as u64))?;
                }
            }
            Packing::Awq => {
                // Each packed row's words are dealt out to the sub-bands' regions.
                let rows = packed_rows as usize;
                let all_rows = 0..rows;
                let mut parts = self
                    .awq_regions(layout, n, rows)
                    .split(std::slice::from_ref(&all_rows));
                let pieces = parts.pop().unwrap_or_default();
                super::shared::read_awq_rows(input, cols.clone(), (0..rows, pieces), row)?;
            }
        }
        self.params.read(input, cols)
    }
}

impl Params {
    /// Reads the zero points and scales of output columns `cols` (the scales checked
    /// finite).
    pub(super) fn read(
        &mut self,
        input: &TransposedInt<'_>,
        cols: std::ops::Range<u64>,
    ) -> Result<(), CopyError> {
        let layout = input.layout;
        let p = layout.per_word();
        let n = cols.end - cols.start;
        // Zero points: their words for the band's columns, a group at a time.
        let zero_row = layout.outputs / p;
        let zero_words = n.div_ceil(p);
        resize_exact(&mut self.zero_words, (zero_words * 4) as usize, 0);
        resize_exact(&mut self.zeros, (layout.groups * n) as usize, 0);
        let carry = layout.zero_carry();
        let mask = (1u32 << layout.bits) - 1;
        // Where column `o`'s value sits in its word depends on `o mod p` alone, and a
        // band is whole words of columns (its rows are a multiple of the sub-band's,
        // which is of a word's, and the weight's outputs are whole words: `check`):
        // each word's values at once.
        debug_assert!(cols.start.is_multiple_of(p) && n.is_multiple_of(p));
        let shifts: Vec<u32> = (0..p)
            .map(|j| layout.column_slot(j) * u32::from(layout.bits))
            .collect();
        for (g, zeros) in (0..layout.groups).zip(self.zeros.chunks_exact_mut(n as usize)) {
            let at = input.qzeros.1.offset + (g * zero_row + cols.start / p) * 4;
            read_exact_at(input.qzeros.0, &mut self.zero_words, at)?;
            let words = self.zero_words.as_chunks::<4>().0;
            for (w, values) in words.iter().zip(zeros.chunks_mut(p as usize)) {
                let w = u32::from_le_bytes(*w).wrapping_add(carry);
                for (z, &shift) in values.iter_mut().zip(&shifts) {
                    *z = ((w >> shift) & mask) as i32;
                }
            }
        }
        // Scales, checked finite, a group's at a time: the stored bytes and their
        // float32 bytes are a group row long (a read band's whole were 2.6 MiB of an
        // AWQ save's peak, half the room its hand-off's spare buffers now take:
        // `shared.rs`).
        let size = layout.scale_dtype.size();
        self.scales.clear();
        self.scales.reserve_exact((layout.groups * n) as usize);
        resize_exact(&mut self.scale_bytes, (n * size) as usize, 0);
        for g in 0..layout.groups {
            let at = input.scales.1.offset + (g * layout.outputs + cols.start) * size;
            read_exact_at(input.scales.0, &mut self.scale_bytes, at)?;
            let from = self.scales.len();
            if let Some(bad) = crate::save::packed_int::widen_scales_onto(
                layout.scale_dtype,
                &self.scale_bytes,
                &mut self.wide,
                &mut self.scales,
            ) {
                let o = cols.start + bad as u64;
                return Err(invalid(format!(
                    "the scales of `{}` hold {} at [{g}, {o}]: the weight cannot be dequantized",
                    input.name,
                    self.scales[from + bad]
                )));
            }
        }
        Ok(())
    }
}
