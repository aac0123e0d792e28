//! A sub-band's values one by one, through its table: GPTQ at 2 bits, and AWQ out of
//! order or in partial 8×8 blocks (the other paths make rows a few at a time, in
//! `band.rs`).

use super::Packing;
use super::band::Decode;

impl Decode<'_> {
    /// Every value of the sub-band written into `output` (`[n, inputs]` elements of
    /// `SIZE` bytes), looked up in the table, value by value: GPTQ's at 2 bits, AWQ's
    /// out of order or in partial 8×8 blocks (the others are made a few rows at a time).
    pub(super) fn decode<const SIZE: usize>(&self, output: &mut [u8]) {
        let Decode {
            layout,
            groups,
            packed,
            band_words,
            skip,
            n,
            table,
            ..
        } = *self;
        let per_word = layout.per_word() as usize;
        let inputs = layout.inputs as usize;
        let bits = u32::from(layout.bits);
        let mask = (1u32 << bits) - 1;
        let values = 1usize << bits;
        let groups_n = layout.groups as usize;
        // The outputs of group g, column `local`.
        let row_of = |g: usize, local: usize| {
            let at = (local * groups_n + g) * values * SIZE;
            &table[at..at + values * SIZE]
        };
        let word_at = |at: usize| u32::from_le_bytes(packed[at]);
        match layout.packing {
            Packing::Gptq { .. } => {
                // Output row by output row, along it: a word a packed row, p inputs a
                // word (of one group when the groups run in order).
                for local in 0..n {
                    let row = &mut output[local * inputs * SIZE..(local + 1) * inputs * SIZE];
                    for (r, dst) in row.chunks_exact_mut(per_word * SIZE).enumerate() {
                        let word = word_at(r * band_words + skip + local);
                        let first = r * per_word;
                        if groups.in_order {
                            let outputs = row_of(groups.of[first] as usize, local);
                            for (k, out) in dst.chunks_exact_mut(SIZE).enumerate() {
                                let q = ((word >> (k as u32 * bits)) & mask) as usize;
                                out.copy_from_slice(&outputs[q * SIZE..(q + 1) * SIZE]);
                            }
                        } else {
                            for (k, out) in dst.chunks_exact_mut(SIZE).enumerate() {
                                let q = ((word >> (k as u32 * bits)) & mask) as usize;
                                let outputs = row_of(groups.of[first + k] as usize, local);
                                out.copy_from_slice(&outputs[q * SIZE..(q + 1) * SIZE]);
                            }
                        }
                    }
                }
            }
            Packing::Awq => {
                // A transposition: tiles of TILE input rows, each input row's words for
                // the sub-band decoded into the tile (a column of it a column of the
                // weight), then the tile's rows copied along the output rows.
                const TILE: usize = 64;
                let first_word = skip / per_word;
                let slots: Vec<u32> = (0..per_word as u64)
                    .map(|c| layout.column_slot(c))
                    .collect();
                let mut tile = vec![0u8; n * TILE * SIZE];
                for i0 in (0..inputs).step_by(TILE) {
                    let rows = TILE.min(inputs - i0);
                    for t in 0..rows {
                        let i = i0 + t;
                        let g = groups.of[i] as usize;
                        let words = i * band_words + first_word;
                        for j in 0..n / per_word {
                            let word = word_at(words + j);
                            for (c, &slot) in slots.iter().enumerate() {
                                let local = j * per_word + c;
                                let q = ((word >> (slot * bits)) & mask) as usize;
                                let at = (local * TILE + t) * SIZE;
                                tile[at..at + SIZE]
                                    .copy_from_slice(&row_of(g, local)[q * SIZE..(q + 1) * SIZE]);
                            }
                        }
                    }
                    for local in 0..n {
                        let at = (local * inputs + i0) * SIZE;
                        output[at..at + rows * SIZE].copy_from_slice(
                            &tile[local * TILE * SIZE..(local * TILE + rows) * SIZE],
                        );
                    }
                }
            }
        }
    }
}
