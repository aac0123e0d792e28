//! AWQ at 4 bits with the groups in order, on a CPU with AVX-512: a sub-band's
//! words transposed into a run of each packed word's values (word `j` of every
//! input), then each word's eight output rows made from its run by word permutes
//! ([`crate::save::avx512::awq_word_rows`]). The 8×8 nibble transposition this
//! replaces ([`Decode::awq_transpose`]) took a seventh of an AWQ save.

use super::band::{Decode, column_stride};
use super::kernels::{awq_word_rows, transpose_into_columns, words_to_rows_in_vectors};
use crate::save::copy::resize_exact;

impl Decode<'_> {
    /// The sub-band's region (its `band_words` words of each input, input after
    /// input) transposed into `streams`, word `j` of every input in a run (a cache line
    /// between runs, as between GPTQ's columns: [`column_stride`]), by 16×16 register
    /// tiles. False, nothing done, where the sub-band is not AWQ's at 4 bits in order,
    /// the CPU lacks AVX-512, or a test asks for the columns' path.
    pub(super) fn awq_streams(&self, streams: &mut Vec<u8>) -> bool {
        #[cfg(test)]
        if super::direct::COLUMNS_ONLY.with(std::cell::Cell::get) {
            return false;
        }
        if !(self.awq_in_order() && self.skip == 0 && words_to_rows_in_vectors()) {
            return false;
        }
        let inputs = self.layout.inputs as usize;
        let stride = column_stride(inputs);
        resize_exact(streams, self.band_words * stride, 0);
        let shape = (self.band_words, inputs);
        transpose_into_columns(self.packed, shape, (streams, stride));
        true
    }

    /// Output rows `first..first + count` of the sub-band (whole words' eight) from
    /// [`Decode::awq_streams`]' runs, into `output` (`count` rows).
    pub(super) fn rows_from_streams<const SIZE: usize>(
        &self,
        streams: &[u8],
        (first, count): (usize, usize),
        output: &mut [u8],
    ) {
        let inputs = self.layout.inputs as usize;
        let groups = self.layout.groups as usize;
        let group = self.layout.group_size as usize;
        let (tables, _) = self.table.as_chunks::<SIZE>().0.as_chunks::<16>();
        let column_at = self.column_at();
        let row_bytes = inputs * SIZE;
        let stride = column_stride(inputs);
        for j in first / 8..(first + count) / 8 {
            let words = streams[j * stride..j * stride + inputs * 4]
                .as_chunks::<4>()
                .0;
            let at = (8 * j - first) * row_bytes;
            let rows = &mut output[at..at + 8 * row_bytes];
            let tables = &tables[8 * j * groups..];
            awq_word_rows::<SIZE>(words, (tables, groups, group), column_at, rows);
        }
    }
}
