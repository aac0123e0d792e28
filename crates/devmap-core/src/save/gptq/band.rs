//! One band of a GPTQ/AWQ weight: its packed words read (a read band, long reads),
//! then output rows made a sub-band at a time through a table of every output a value
//! can have, per group and column.

use super::kernels::{awq_columns, byte_row, expand_rows};
use super::{Packing, TransposedInt, TransposedIntLayout};
use crate::save::copy::{CopyError, line_aligned, resize_exact};
use crate::save::lookup::expand_by_input;
use crate::types::DType;

/// Where finished output rows go: the first row's index, and the rows (which a LoRA
/// merge may change before they are written).
pub(super) type Emit<'a> = dyn FnMut(u64, Made<'_>) -> Result<(), CopyError> + 'a;

/// Output rows made in `buffer[range]`. Whoever they are handed to may take the
/// buffer, leaving another in its place (`save::hand_off`).
pub(super) struct Made<'a> {
    pub(super) buffer: &'a mut Vec<u8>,
    pub(super) range: std::ops::Range<usize>,
}

impl Made<'_> {
    pub(super) fn rows(&mut self) -> &mut [u8] {
        &mut self.buffer[self.range.clone()]
    }
}

/// One read band's inputs and a sub-band's output: what a thread streaming a weight
/// alone holds.
#[derive(Default)]
pub(super) struct Band {
    pub(super) shared: Shared,
    pub(super) work: Work,
}

impl Band {
    /// Reads output columns `cols` of every packed row, zero point and scale.
    pub(super) fn read(
        &mut self,
        input: &TransposedInt<'_>,
        cols: std::ops::Range<u64>,
    ) -> Result<(), CopyError> {
        self.shared.read(input, cols, &mut self.work.row)
    }
}

/// A read band: the packed words, zero points and scales of its output columns (which
/// the threads of an AWQ weight share: `super::shared`).
#[derive(Default)]
pub(super) struct Shared {
    /// The read band's words (little-endian): GPTQ's at 4 and 8 bits in columns, each
    /// output row's packed words in input order ([`column_stride`] apart), other
    /// widths row after row; AWQ's a sub-band after another, each row after row.
    /// Either way the words a sub-band's rows are made from are read in order, not a
    /// few dozen bytes of every row of a read band too large for the cache.
    pub(super) packed: Vec<u8>,
    /// Where the read band starts in `packed`: a cache line's boundary.
    pub(super) start: usize,
    /// Words of the read band in a packed row.
    pub(super) words_a_row: usize,
    /// The band's zero points and scales.
    pub(super) params: Params,
    /// The weight's rows are made from its words as read
    /// ([`super::direct::rows_from_words`]): GPTQ's read band is kept as read.
    pub(super) from_words: bool,
}

/// A read band's zero points and scales, unpacked and widened (`read.rs`).
#[derive(Default)]
pub(super) struct Params {
    /// Zero points, `[groups, band]`, unpacked.
    pub(super) zeros: Vec<i32>,
    pub(super) zero_words: Vec<u8>,
    /// Scales, `[groups, band]`, as f32.
    pub(super) scales: Vec<f32>,
    pub(super) scale_bytes: Vec<u8>,
    pub(super) wide: Vec<u8>,
}

/// A thread's buffers for reading rows and making a sub-band's output.
#[derive(Default)]
pub(super) struct Work {
    /// One packed row's words of the read band, as read (GPTQ: sixteen rows').
    pub(super) row: Vec<u8>,
    /// The output of each of the `2^bits` values, per group and column of the
    /// sub-band (`(q − z) · s` is one of 16, or 256, for a group and column), as f32
    /// bytes, rounded to the scale's dtype, and converted.
    floats: Vec<u8>,
    rounded: Vec<u8>,
    table: Vec<u8>,
    /// The table's products (a chunk of entries), exact in f32; 8-bit GPTQ's of an
    /// output row.
    products: Vec<f32>,
    /// AWQ: a sub-band's 4-bit values gathered in input order, an output row every
    /// stride (kept between sub-bands rather than allocated for each).
    columns: Vec<u8>,
    output: Vec<u8>,
    /// GPTQ's rows made from its words: the zero points and scales of sixteen output
    /// rows, `[groups, 16]` ([`super::direct`]).
    block_params: super::direct::BlockParams,
}

impl Work {
    /// Output rows `cols` (of the read band `read`, starting at `first`) of every input
    /// column, handed to `emit` (the first row's index, and the rows) a few rows at a
    /// time (AWQ's 4-bit weights in order, GPTQ's 4-bit weights) or all at once.
    pub(super) fn dequantize(
        &mut self,
        read: &Shared,
        layout: TransposedIntLayout,
        groups: &Groups,
        (first, cols): (u64, std::ops::Range<u64>),
        to: DType,
        emit: &mut Emit<'_>,
    ) -> Result<(), CopyError> {
        let n = (cols.end - cols.start) as usize;
        let read_n = read.params.zeros.len() / layout.groups as usize;
        let skip = (cols.start - first) as usize;
        let inputs = layout.inputs as usize;
        let size = to.size() as usize;
        let values = 1usize << layout.bits;
        // Every output a value can have, per group and column: `(v − z) · s` for each
        // of the 2^bits values v, exact in f32, then rounded to the scale's dtype and
        // converted to `to` by the vectorized casts: `[n, groups, values]` elements
        // (an output row's tables together, as the row is made group after group).
        // (A group holds many values a pattern: 4 bits in groups of 32 or more.)
        let groups_n = layout.groups as usize;
        // Made a few columns' entries at a time, so the floats and their rounding
        // stay in the cache between the passes.
        const CHUNK: usize = 2048;
        let columns_a_chunk = (CHUNK / groups_n.max(1)).max(1);
        // (8-bit GPTQ computes each value: a group holds fewer than its 256 patterns.)
        let table_columns = if gptq_bytes(layout) || read.from_words {
            0
        } else {
            n
        };
        let (zeros, scales) = (&read.params.zeros, &read.params.scales);
        resize_exact(&mut self.table, table_columns * groups_n * values * size, 0);
        for l0 in (0..table_columns).step_by(columns_a_chunk) {
            let columns = columns_a_chunk.min(table_columns - l0);
            let count = columns * groups_n;
            resize_exact(&mut self.products, count * values, 0.0);
            // A group's zero points and scales of the chunk's columns lie side by
            // side (`[groups, read_n]`): read so, group after group, each column's
            // entry `groups_n` entries from the next (read down the columns, a group
            // apart, the loads missed the cache: a twentieth of an AWQ save).
            for g in 0..groups_n {
                let at = g * read_n + skip + l0;
                let params = zeros[at..at + columns]
                    .iter()
                    .zip(&scales[at..at + columns]);
                for (local, (&z, &s)) in params.enumerate() {
                    let entry = (local * groups_n + g) * values;
                    for (v, product) in self.products[entry..entry + values].iter_mut().enumerate()
                    {
                        *product = (v as i32 - z) as f32 * s;
                    }
                }
            }
            let at = l0 * groups_n * values * size;
            crate::save::lookup::round_products(
                &self.products,
                layout.scale_dtype,
                to,
                (&mut self.floats, &mut self.rounded),
                &mut self.table[at..at + count * values * size],
            );
        }
        let words = read.packed[read.start..].as_chunks::<4>().0;
        let (packed, band_words, words_skip) = match layout.packing {
            Packing::Gptq { .. } => (words, read.words_a_row, skip),
            // The sub-band's own region: its words of each row, row after row.
            Packing::Awq => {
                // (AWQ's packed rows are the input rows.)
                let sub = awq_sub_words(layout);
                let region = skip / 8 / sub * sub * inputs;
                let n_words = n.div_ceil(8);
                (&words[region..region + n_words * inputs], n_words, 0)
            }
        };
        let band = Decode {
            layout,
            groups,
            packed,
            band_words,
            skip: words_skip,
            n,
            table: &self.table,
            params: (&read.params.zeros, &read.params.scales, read_n, skip),
        };
        // AWQ's 4-bit weights in order, transposed whole first, and GPTQ's at 4 bits are
        // made and handed on a few rows at a time (GPTQ's whole blocks of rows), so the
        // write copies from the cache what was just made, and two threads' writes to
        // one file do not queue on its lock for whole sub-bands.
        let rows_a_block = (super::OUTPUT_BYTES as usize / (inputs * size)).max(1);
        // Where the blocks go: `n` rows of `inputs · size` bytes, from output row
        // `cols.start` on.
        let rows = (n, inputs * size, cols.start);
        if read.from_words {
            let step = rows_a_block.next_multiple_of(BLOCK_ROWS);
            let params = &mut self.block_params;
            return in_blocks(
                &mut self.output,
                (rows, step),
                emit,
                &mut |block, output| {
                    if size == 2 {
                        band.rows_from_words::<2>(to, block, params, output);
                    } else {
                        band.rows_from_words::<4>(to, block, params, output);
                    }
                },
            );
        }
        // AWQ at 4 bits in order, on AVX-512: a packed word's eight rows at a time,
        // from that word of every input (`streams.rs`).
        if size == 2 && band.awq_streams(&mut self.columns) {
            let (step, streams) = ((rows_a_block / 8).max(1) * 8, &self.columns);
            return in_blocks(
                &mut self.output,
                (rows, step),
                emit,
                &mut |block, output| {
                    band.rows_from_streams::<2>(streams, block, output);
                },
            );
        }
        let awq_stride = band
            .awq_in_order()
            .then(|| band.awq_transpose(&mut self.columns));
        let mut scratch = Scratch {
            columns: &mut self.columns,
            products: &mut self.products,
            floats: &mut self.floats,
            rounded: &mut self.rounded,
            to,
        };
        if awq_stride.is_some() || gptq_in_columns(layout) {
            let step = match awq_stride {
                Some(_) => rows_a_block,
                None => rows_a_block.next_multiple_of(BLOCK_ROWS),
            };
            return in_blocks(
                &mut self.output,
                (rows, step),
                emit,
                &mut |block, output| {
                    let first = block.0;
                    match (awq_stride, size) {
                        (Some(stride), 2) => {
                            let columns = (&scratch.columns[first * stride..], stride);
                            band.expand::<2>(columns, block, output);
                        }
                        (Some(stride), _) => {
                            let columns = (&scratch.columns[first * stride..], stride);
                            band.expand::<4>(columns, block, output);
                        }
                        (None, 2) => band.gptq_rows::<2>(&mut scratch, block, output),
                        (None, _) => band.gptq_rows::<4>(&mut scratch, block, output),
                    }
                },
            );
        }
        let range = line_range(&mut self.output, n * inputs * size);
        let output = &mut self.output[range.clone()];
        if size == 2 {
            band.decode::<2>(output);
        } else {
            band.decode::<4>(output);
        }
        emit(
            cols.start,
            Made {
                buffer: &mut self.output,
                range,
            },
        )
    }
}

/// Makes a block of output rows: its first row and count, and its bytes.
type MakeBlock<'a> = dyn FnMut((usize, usize), &mut [u8]) + 'a;

/// Output rows `0..n` made `step` at a time by `make` into `output` (from a cache
/// line's boundary, `row_bytes` a row), each block handed to `emit` as row `first` +
/// its first.
fn in_blocks(
    output: &mut Vec<u8>,
    ((n, row_bytes, first), step): ((usize, usize, u64), usize),
    emit: &mut Emit<'_>,
    make: &mut MakeBlock<'_>,
) -> Result<(), CopyError> {
    for block in (0..n).step_by(step) {
        let count = step.min(n - block);
        let range = line_range(output, count * row_bytes);
        make((block, count), &mut output[range.clone()]);
        emit(
            first + block as u64,
            Made {
                buffer: output,
                range,
            },
        )?;
    }
    Ok(())
}

/// Where `len` bytes of `buffer` from a cache line's boundary are ([`line_aligned`]),
/// so the kernels' 64-byte stores of output rows fall each in one line.
fn line_range(buffer: &mut Vec<u8>, len: usize) -> std::ops::Range<usize> {
    let start = line_aligned(buffer, len);
    start..start + len
}

/// `src` into `dst` (as long): 64 bytes at a time as arrays, each one vector move, then
/// the bytes past them. A `copy_from_slice` of a length known only at run time is a
/// call to `memmove`, whose cost, paid for each 64 or 128 bytes dealt out of a read
/// band, was 4% of an AWQ save.
pub(super) fn copy_in_lines(dst: &mut [u8], src: &[u8]) {
    let (lines, rest) = src.as_chunks::<64>();
    let (to, to_rest) = dst.as_chunks_mut::<64>();
    for (d, s) in to.iter_mut().zip(lines) {
        *d = *s;
    }
    if !rest.is_empty() {
        to_rest.copy_from_slice(rest);
    }
}

/// Output rows GPTQ's rows are made a block of at a time (`Decode::gptq_rows`), and
/// what its sub-bands are whole blocks of.
pub(super) const BLOCK_ROWS: usize = 16;

/// Packed rows read before their words are laid out for the kernels: transposed into
/// the band's columns (`read.rs`), or dealt to the blocks of sixteen columns
/// (`direct::read_in_blocks`, fewer where the rows are long).
pub(super) const TILE_ROWS: usize = 16;

/// Bytes from one column of GPTQ's read band to the next (`Band::packed`): its packed
/// rows' words, and a cache line, so a tile's sixteen stores (one a column) do not all
/// fall in one cache set, as columns a multiple of 4 KiB apart would.
pub(super) fn column_stride(packed_rows: usize) -> usize {
    packed_rows * 4 + 64
}

/// Whether GPTQ's words are read into the band's columns (`Band::packed`): at 4 and 8 bits,
/// whose rows [`Decode::gptq_rows`] makes from them.
pub(super) fn gptq_in_columns(layout: TransposedIntLayout) -> bool {
    matches!(layout.packing, Packing::Gptq { .. }) && matches!(layout.bits, 4 | 8)
}

/// Whether the weight is GPTQ's at 8 bits, whose rows are computed value by value
/// ([`Decode::byte_rows`]) rather than through a table.
fn gptq_bytes(layout: TransposedIntLayout) -> bool {
    matches!(layout.packing, Packing::Gptq { .. }) && layout.bits == 8
}

/// The buffers a sub-band's rows are made in: the gathered values, and 8-bit GPTQ's
/// products and their rounding; and the dtype they are made in.
struct Scratch<'a> {
    columns: &'a mut Vec<u8>,
    products: &'a mut Vec<f32>,
    floats: &'a mut Vec<u8>,
    rounded: &'a mut Vec<u8>,
    to: DType,
}

/// AWQ's words of a whole sub-band in a packed row (a word holds eight columns).
pub(super) fn awq_sub_words(layout: TransposedIntLayout) -> usize {
    (super::band_rows(layout) / layout.per_word()) as usize
}

/// Each input row's group: `g_idx`'s, and whether they run in order (`i / group_size`),
/// so a word's values share one.
pub(super) struct Groups {
    pub(super) of: Vec<u32>,
    pub(super) in_order: bool,
}

/// A sub-band's packed values, where they are in the read band, and its table.
pub(super) struct Decode<'a> {
    pub(super) layout: TransposedIntLayout,
    pub(super) groups: &'a Groups,
    pub(super) packed: &'a [[u8; 4]],
    pub(super) band_words: usize,
    /// Columns of the read band before the sub-band in `packed`'s rows (AWQ's hold
    /// the sub-band's only), and the sub-band's columns.
    pub(super) skip: usize,
    pub(super) n: usize,
    /// `[n, groups, values]` outputs of `SIZE` bytes.
    pub(super) table: &'a [u8],
    /// The read band's zero points and scales (`[groups, read_n]`), and the sub-band's
    /// first column among them.
    pub(super) params: (&'a [i32], &'a [f32], usize, usize),
}

impl Decode<'_> {
    /// Whether the sub-band is AWQ's at 4 bits with the groups in order and whole
    /// 8×8 blocks, which [`Decode::awq_transpose`] and [`Decode::expand`] make.
    pub(super) fn awq_in_order(&self) -> bool {
        self.layout.packing == Packing::Awq
            && self.layout.bits == 4
            && self.groups.in_order
            && (self.layout.inputs as usize).is_multiple_of(8)
            && self.n.is_multiple_of(8)
            && self.skip.is_multiple_of(8)
    }

    /// Which of its eight output columns each nibble of an AWQ word holds.
    pub(super) fn column_at(&self) -> [usize; 8] {
        let mut column_at = [0usize; 8];
        for c in 0..8u64 {
            column_at[self.layout.column_slot(c) as usize] = c as usize;
        }
        column_at
    }

    /// AWQ at 4 bits with the groups in order: each 8×8 block of values (eight input
    /// rows' words for eight output columns) transposed into the output rows' nibbles
    /// in input order, into `columns`, an output row every (returned) stride.
    fn awq_transpose(&self, columns: &mut Vec<u8>) -> usize {
        let column_at = self.column_at();
        let inputs = self.layout.inputs as usize;
        let stride = inputs / 2 + 64;
        resize_exact(columns, self.n * stride, 0);
        awq_columns(
            (self.packed, self.band_words, self.skip / 8),
            (inputs, self.n),
            column_at,
            (columns, stride),
        );
        stride
    }

    /// Output rows `first..first + count` of the sub-band from their nibbles in input
    /// order (`columns`: row `first`'s first), each group expanded through its table,
    /// into `output` (`count` rows).
    fn expand<const SIZE: usize>(
        &self,
        columns: (&[u8], usize),
        (first, count): (usize, usize),
        output: &mut [u8],
    ) {
        let (tables, _) = self.table.as_chunks::<SIZE>().0.as_chunks::<16>();
        expand_rows::<SIZE>(
            columns,
            (first, count),
            (
                self.layout.groups as usize,
                self.layout.inputs as usize,
                self.layout.group_size as usize,
            ),
            tables,
            output,
        );
    }

    /// GPTQ at 4 and 8 bits: output rows `first..first + count` of the sub-band into
    /// `output` (`count` rows). Each output row's words are gathered into a run of bytes
    /// (GPTQ's values lie in input order, the low bits first), then expanded: at 4 bits
    /// with the groups in order a group's bytes through its 16 outputs at a time, in act
    /// order each value through its own input's group's; at 8 bits each value computed
    /// ([`Decode::byte_rows`]).
    fn gptq_rows<const SIZE: usize>(
        &self,
        scratch: &mut Scratch<'_>,
        (first, count): (usize, usize),
        output: &mut [u8],
    ) {
        let layout = self.layout;
        let per_word = layout.per_word() as usize;
        let inputs = layout.inputs as usize;
        let packed_rows = inputs / per_word;
        let words_a_group = (layout.group_size as usize / per_word).max(1);
        let (tables, _) = self.table.as_chunks::<SIZE>().0.as_chunks::<16>();
        // Each output row's words lie in order in the read band's columns.
        let stride = column_stride(packed_rows);
        let bytes = self.packed.as_flattened();
        let end = first + count;
        for block in (first..end).step_by(BLOCK_ROWS) {
            let width = BLOCK_ROWS.min(end - block);
            let columns = &bytes[(self.skip + block) * stride..];
            let output = &mut output[(block - first) * inputs * SIZE..];
            if layout.bits == 8 {
                let buffers = (
                    &mut *scratch.products,
                    &mut *scratch.floats,
                    &mut *scratch.rounded,
                );
                self.byte_rows::<SIZE>(
                    (columns, stride),
                    (block, width),
                    buffers,
                    scratch.to,
                    output,
                );
            } else if self.groups.in_order {
                expand_rows::<SIZE>(
                    (columns, stride),
                    (block, width),
                    (layout.groups as usize, inputs, words_a_group * 8),
                    tables,
                    output,
                );
            } else {
                expand_by_input::<SIZE>(
                    (columns, stride),
                    (block, width),
                    (&self.groups.of, layout.groups as usize),
                    tables,
                    output,
                );
            }
        }
    }

    /// GPTQ at 8 bits: rows `first..first + count` of the sub-band from their bytes in
    /// input order (`columns`, an output row every stride), each value `(q − z) · s`
    /// computed in f32 (exact, as the table's entries are), a row at a time, then rounded
    /// to the scale's dtype and converted to `to` ([`round_products`]). A group of 128
    /// values has fewer values than a byte has patterns, so a table would cost more than
    /// it saves.
    fn byte_rows<const SIZE: usize>(
        &self,
        (columns, stride): (&[u8], usize),
        (first, count): (usize, usize),
        scratch: (&mut Vec<f32>, &mut Vec<u8>, &mut Vec<u8>),
        to: DType,
        output: &mut [u8],
    ) {
        let layout = self.layout;
        let inputs = layout.inputs as usize;
        let (zeros, scales, read_n, skip) = self.params;
        let param = |g: usize, local: usize| {
            let at = g * read_n + skip + local;
            (zeros[at], scales[at])
        };
        let (products, floats, rounded) = scratch;
        let mut params = Vec::new();
        let of = (!self.groups.in_order).then_some(self.groups.of.as_slice());
        for k in 0..count {
            params.clear();
            params.extend((0..layout.groups as usize).map(|g| param(g, first + k)));
            byte_row(
                &columns[k * stride..k * stride + inputs],
                (of, layout.group_size as usize),
                &params,
                (layout.scale_dtype, to),
                (&mut *products, &mut *floats, &mut *rounded),
                &mut output[k * inputs * SIZE..(k + 1) * inputs * SIZE],
            );
        }
    }
}
