//! Fine-grained FP8 dequantization while streaming (DeepSeek V3/R1 and the "-FP8"
//! releases: `quantization_config.quant_method == "fp8"`). A weight `W` of F8_E4M3 (or
//! F8_E5M2) with `[..., M, N]` elements has a `W_scale_inv` of F32 holding one scale per
//! `bm × bn` block (`weight_block_size`), `[..., ⌈M/bm⌉, ⌈N/bn⌉]`; the value is
//! `f32(W[i, j]) × s[i / bm, j / bn]`, one float32 multiply, then converted to the output
//! dtype as torch's `.to()` rounds (`save::cast`).
//!
//! The block is the config's, as DeepSeek's kernel has it. transformers'
//! `Fp8Dequantize` instead infers the block from the scale grid (`rows // scale_rows`),
//! which gives other blocks where M or N is not a multiple of the block size; where
//! they divide evenly the two agree bit for bit (tests/python/fp8_dequant.py).
//!
//! The scales (a few KiB per weight) are read whole; the weight streams through fixed
//! buffers a band of whole rows at a time (its rows split among the cores when written
//! to a file), so memory does not grow with the tensor. Each value is looked up in its
//! block's table of the outputs its byte (or FP4 code) can have, made with the same
//! multiply, rounding and cast (`tables.rs`).

use std::fs::File;
use std::io;
use std::sync::OnceLock;

use super::copy::{CopyError, Stop, read_exact_at};
use crate::types::DType;
use crate::types::range::ByteRange;

mod bits;
mod tables;
pub(crate) use bits::Fp8Bits;
pub use tables::{Fp4Tables, Fp8Tables};

/// What a fine-grained FP8 checkpoint holds beside each weight (transformers' FP8
/// layers have them as parameters); a dequantized model has none of them.
const COMPANIONS: [&str; 3] = ["_scale_inv", ".activation_scale", ".input_scale"];

/// Whether `name` is a scale an FP8 weight carries beside it.
pub fn is_companion(name: &str) -> bool {
    COMPANIONS.iter().any(|c| name.ends_with(c))
}

/// Input bytes (FP8 elements) read per band of rows, at most.
const BAND_ELEMENTS: usize = 1 << 20;

/// The buffers of one dequantizing stream at most: the band, its float32 values and its
/// output (up to float32). A band is one row when a row is longer.
pub const BAND_BYTES: u64 = BAND_ELEMENTS as u64 * (1 + 4 + 4 + 4);

/// The block layout of one quantized weight: its last two dimensions and the block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fp8Blocks {
    /// M: rows of each matrix (the second-to-last dimension).
    pub rows: u64,
    /// N: columns (the last dimension).
    pub cols: u64,
    pub block_rows: u64,
    pub block_cols: u64,
    /// The scales' dtype: float32 or `F8E8M0` (DeepSeek-V4's `ue8m0`) for fine-grained
    /// FP8; compressed-tensors stores them in bfloat16 (or float16, float32); `F8E8M0`
    /// for MXFP8's power-of-two exponents (stored as U8).
    pub scale_dtype: DType,
    /// The dtype each product is rounded to before the output's: float32 where the
    /// reference multiplies in float32 (transformers' FP8), the scales' dtype for
    /// compressed-tensors (bfloat16 for MXFP8's exponents).
    pub product: DType,
}

impl Fp8Blocks {
    /// Scale rows and columns per matrix.
    pub fn grid(&self) -> (u64, u64) {
        (
            self.rows.div_ceil(self.block_rows),
            self.cols.div_ceil(self.block_cols),
        )
    }

    /// Scale elements for a weight of `elements` FP8 values.
    pub fn scale_count(&self, elements: u64) -> u64 {
        let (sr, sc) = self.grid();
        let matrices = elements / (self.rows * self.cols).max(1);
        matrices * sr * sc
    }
}

/// FP4 E2M1's sixteen codes (transformers' `Fp8Dequantize._FP4_E2M1_LUT`: sign bit 8,
/// code 8 is −0), for the FP4-packed experts of a DeepSeek-V4 checkpoint.
const E2M1: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// Bytes a stored row of `cols` values takes: one a value for FP8; half for packed FP4
/// (`I8`: two E2M1 codes a byte, the low nibble first, as DeepSeek-V4 stores its
/// routed experts).
pub fn row_bytes(from: DType, cols: u64) -> u64 {
    if from == DType::I8 {
        cols.div_ceil(2)
    } else {
        cols
    }
}

/// float32 value of each F8_E4M3 byte (NaN for its two NaNs).
pub fn e4m3_values() -> &'static [f32; 256] {
    table(DType::F8E4M3)
}

/// float32 value of each byte of `from`, E4M3 or E5M2 (E4M3's for any other).
#[cfg(test)]
pub(crate) fn values(from: DType) -> &'static [f32; 256] {
    table(from)
}

/// float32 value of each FP8 byte.
fn table(from: DType) -> &'static [f32; 256] {
    static E4M3: OnceLock<[f32; 256]> = OnceLock::new();
    static E5M2: OnceLock<[f32; 256]> = OnceLock::new();
    let decode = |exp_bits: u32, man_bits: u32, fn_nan: bool| {
        let mut t = [0f32; 256];
        let bias = (1i32 << (exp_bits - 1)) - 1;
        for (b, slot) in t.iter_mut().enumerate() {
            let b = b as u32;
            let sign = if b & 0x80 != 0 { -1.0f32 } else { 1.0 };
            let e = (b >> man_bits) & ((1 << exp_bits) - 1);
            let m = b & ((1 << man_bits) - 1);
            let frac = m as f32 / (1u32 << man_bits) as f32;
            let max_e = (1 << exp_bits) - 1;
            *slot = if fn_nan && e == max_e && m == (1 << man_bits) - 1 {
                // e4m3fn: S.1111.111 is NaN; there is no infinity.
                f32::NAN
            } else if !fn_nan && e == max_e {
                if m == 0 {
                    sign * f32::INFINITY
                } else {
                    f32::NAN
                }
            } else if e == 0 {
                sign * frac * 2f32.powi(1 - bias)
            } else {
                sign * (1.0 + frac) * 2f32.powi(e as i32 - bias)
            };
        }
        t
    };
    match from {
        DType::F8E5M2 => E5M2.get_or_init(|| decode(5, 2, false)),
        _ => E4M3.get_or_init(|| decode(4, 3, true)),
    }
}

/// An FP8 weight's block scales, read whole (a few KiB per weight), and what turns a
/// band of its rows into float32 values: for a LoRA merge into the dequantized weight.
pub struct Fp8Rows {
    from: DType,
    blocks: Fp8Blocks,
    scales: Vec<f32>,
}

impl Fp8Rows {
    /// Reads and checks the scales of weight `name` (`from`, FP8 or packed FP4, of
    /// `stored` bytes).
    pub fn load(
        name: &str,
        (scale_file, scale): (&File, ByteRange),
        blocks: Fp8Blocks,
        from: DType,
        stored: u64,
    ) -> Result<Fp8Rows, CopyError> {
        let elements = stored / row_bytes(from, blocks.cols).max(1) * blocks.cols;
        let want_scales = blocks.scale_count(elements);
        let size = blocks.scale_dtype.size();
        if scale.len != want_scales * size || blocks.cols == 0 || blocks.rows == 0 {
            return Err(CopyError::Io(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "the scales of `{name}` hold {} bytes, but {} {} scales are needed",
                    scale.len, want_scales, blocks.scale_dtype
                ),
            )));
        }
        let mut raw = vec![0u8; scale.len as usize];
        read_exact_at(scale_file, &mut raw, scale.offset)?;
        let mut scales = vec![0f32; want_scales as usize];
        if blocks.scale_dtype == DType::F32 {
            for (s, b) in scales.iter_mut().zip(raw.chunks_exact(4)) {
                *s = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        } else if blocks.scale_dtype == DType::F8E8M0 {
            // MX scales: a biased power of two, 2^(e − 127), exact in bfloat16 (the
            // dtype compressed-tensors decompresses them to) and in f32; 0xFF is NaN.
            for (s, &e) in scales.iter_mut().zip(&raw) {
                *s = match e {
                    0 => f32::from_bits(0x0040_0000),
                    255 => f32::NAN,
                    e => f32::from_bits(u32::from(e) << 23),
                };
            }
        } else {
            let mut wide = vec![0u8; scales.len() * 4];
            super::cast::cast(blocks.scale_dtype, DType::F32, &raw, &mut wide);
            for (s, b) in scales.iter_mut().zip(wide.chunks_exact(4)) {
                *s = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        if let Some(bad) = scales.iter().position(|s| !s.is_finite()) {
            return Err(CopyError::Io(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "the scales of `{name}` hold {} at element {bad}: the weight cannot be dequantized",
                    scales[bad]
                ),
            )));
        }
        Ok(Fp8Rows {
            from,
            blocks,
            scales,
        })
    }

    /// `f32(W[i, j]) × s[i / bm, j / bn]` for the whole rows in `input`, the first of
    /// which is row `first` of the weight (counted over every matrix of it).
    pub fn values(&self, first: u64, input: &[u8], out: &mut [f32]) {
        let blocks = self.blocks;
        let lut = table(self.from);
        let cols = blocks.cols as usize;
        let stored = row_bytes(self.from, blocks.cols) as usize;
        for (k, (band_row, out_row)) in input
            .chunks_exact(stored)
            .zip(out.chunks_exact_mut(cols))
            .enumerate()
        {
            let scale_row = self.scale_row(first + k as u64);
            if self.from == DType::I8 {
                let bc = blocks.block_cols as usize;
                for (c, o) in out_row.iter_mut().enumerate() {
                    let byte = band_row[c / 2];
                    let code = if c % 2 == 0 { byte & 0xF } else { byte >> 4 };
                    *o = E2M1[usize::from(code)] * scale_row[c / bc];
                }
                continue;
            }
            for ((block, values), s) in band_row
                .chunks(blocks.block_cols as usize)
                .zip(out_row.chunks_mut(blocks.block_cols as usize))
                .zip(scale_row)
            {
                for (b, o) in block.iter().zip(values) {
                    *o = lut[*b as usize] * s;
                }
            }
        }
        self.round_products(out);
    }

    /// The index of row `r`'s first block scale (rows counted over every matrix of the
    /// weight).
    fn scale_at(&self, r: u64) -> usize {
        let blocks = self.blocks;
        let (sr, sc) = blocks.grid();
        let (matrix, i) = (r / blocks.rows, r % blocks.rows);
        ((matrix * sr + i / blocks.block_rows) * sc) as usize
    }

    /// Row `r`'s block scales.
    fn scale_row(&self, r: u64) -> &[f32] {
        let at = self.scale_at(r);
        &self.scales[at..at + self.blocks.grid().1 as usize]
    }

    /// `each(block, dst, s)` for each block of the rows from row `first` on, in order:
    /// its stored bytes (`input`: `stored` bytes a row, `block_in` a block), its output
    /// (`out`: `size` bytes a value) and its scale. (Nested loops with a callback, not
    /// a flattened iterator: that measured a tenth slower on packed FP4's small blocks.)
    fn each_block(
        &self,
        first: u64,
        (input, stored, block_in): (&[u8], usize, usize),
        (out, size): (&mut [u8], usize),
        mut each: impl FnMut(&[u8], &mut [u8], f32),
    ) {
        let (cols, bc) = (self.blocks.cols as usize, self.blocks.block_cols as usize);
        for (r, row, out_row) in rows(first, (input, stored), (out, cols * size)) {
            let blocks = row.chunks(block_in).zip(out_row.chunks_mut(bc * size));
            for ((block, dst), &s) in blocks.zip(self.scale_row(r)) {
                each(block, dst, s);
            }
        }
    }

    /// f32 products rounded as the reference rounds them: compressed-tensors multiplies
    /// in the scales' dtype, so the product is rounded to it before any cast to the
    /// output's.
    fn round_products(&self, out: &mut [f32]) {
        match self.blocks.product {
            DType::BF16 => {
                for v in out.iter_mut() {
                    *v = crate::save::cast::round_to_bf16(*v);
                }
            }
            DType::F16 => {
                for v in out.iter_mut() {
                    *v = half::f16::from_f32(*v).to_f32();
                }
            }
            _ => {}
        }
    }
}

/// Each stored row of `input` (`stored` bytes) with its output row (`out_row` bytes of
/// `out`) and its index in the weight, the first being `first`.
fn rows<'a>(
    first: u64,
    (input, stored): (&'a [u8], usize),
    (out, out_row): (&'a mut [u8], usize),
) -> impl Iterator<Item = (u64, &'a [u8], &'a mut [u8])> {
    (first..)
        .zip(
            input
                .chunks_exact(stored)
                .zip(out.chunks_exact_mut(out_row)),
        )
        .map(|(r, (row, out))| (r, row, out))
}

/// A fine-grained FP8 (or packed FP4) weight to dequantize: `name` names it in errors (a
/// scale that is NaN, infinite or of the wrong size).
#[derive(Clone, Copy)]
pub struct Fp8Weight<'a> {
    pub name: &'a str,
    pub source: (&'a File, ByteRange),
    pub scale: (&'a File, ByteRange),
    pub blocks: Fp8Blocks,
    /// The stored dtype and the output's.
    pub dtypes: (DType, DType),
}

impl Fp8Weight<'_> {
    fn stored_row(&self) -> u64 {
        row_bytes(self.dtypes.0, self.blocks.cols)
    }

    fn total_rows(&self) -> u64 {
        self.source.1.len / self.stored_row().max(1)
    }
}

/// Reads the weight and its scales, and hands `sink` the dequantized value converted
/// to the output dtype, a band of rows at a time.
pub fn stream(
    weight: Fp8Weight<'_>,
    cancel: &dyn Stop,
    sink: &mut dyn FnMut(&[u8]) -> io::Result<()>,
) -> Result<(), CopyError> {
    let rows = load_rows(weight)?;
    stream_rows(weight, &rows, 0..weight.total_rows(), cancel, sink)
}

/// [`stream`] with the rows split among `threads` threads, each writing its rows in
/// place in `dst` from `dst_offset` on. Returns the bytes written.
pub fn write_in_parallel(
    weight: Fp8Weight<'_>,
    (dst, dst_offset): (&File, u64),
    threads: u64,
    cancel: &(dyn Stop + Sync),
) -> Result<u64, CopyError> {
    let rows = load_rows(weight)?;
    let total = weight.total_rows();
    let out_row = weight.blocks.cols * weight.dtypes.1.size();
    super::copy::write_parts_in_parallel(
        total,
        out_row,
        threads,
        (dst, dst_offset),
        &|range, sink| stream_rows(weight, &rows, range, cancel, sink),
    )?;
    Ok(total * out_row)
}

fn load_rows(weight: Fp8Weight<'_>) -> Result<Fp8Rows, CopyError> {
    Fp8Rows::load(
        weight.name,
        weight.scale,
        weight.blocks,
        weight.dtypes.0,
        weight.source.1.len,
    )
}

/// [`stream`] of rows `range`.
fn stream_rows(
    weight: Fp8Weight<'_>,
    rows: &Fp8Rows,
    range: std::ops::Range<u64>,
    cancel: &dyn Stop,
    sink: &mut dyn FnMut(&[u8]) -> io::Result<()>,
) -> Result<(), CopyError> {
    let Fp8Weight {
        source: (src, source),
        blocks,
        dtypes: (from, to),
        ..
    } = weight;
    let cols = blocks.cols as usize;
    let stored = weight.stored_row();
    let band_rows = (BAND_ELEMENTS / cols).max(1);
    // Straight into the output through tables of every output a block's values can
    // have (packed FP4 when its blocks are whole bytes).
    let tables = from != DType::I8 || blocks.block_cols.is_multiple_of(2);
    let mut input = vec![0u8; band_rows * stored as usize];
    let (mut floats, mut values) = if tables {
        (Vec::new(), Vec::new())
    } else {
        (
            vec![0f32; band_rows * cols],
            vec![0u8; band_rows * cols * 4],
        )
    };
    let mut output = vec![0u8; band_rows * cols * to.size() as usize];
    let (mut fp4, mut fp8) = (Fp4Tables::default(), Fp8Tables::default());
    let mut row = range.start;
    while row < range.end {
        if cancel.stop() {
            return Err(CopyError::Cancelled);
        }
        let n = (range.end - row).min(band_rows as u64) as usize;
        let input = &mut input[..n * stored as usize];
        read_exact_at(src, input, source.offset + row * stored).map_err(|e| match e {
            CopyError::ShortSource { copied } => CopyError::ShortSource {
                copied: row * stored + copied,
            },
            e => e,
        })?;
        let out = &mut output[..n * cols * to.size() as usize];
        if tables {
            if from == DType::I8 {
                rows.fp4_into(row, input, to, &mut fp4, out);
            } else {
                rows.fp8_into(row, input, to, &mut fp8, out);
            }
            sink(out).map_err(CopyError::Io)?;
            row += n as u64;
            continue;
        }
        let floats = &mut floats[..n * cols];
        rows.values(row, input, floats);
        let values = &mut values[..n * cols * 4];
        for (v, o) in floats.iter().zip(values.chunks_exact_mut(4)) {
            o.copy_from_slice(&v.to_le_bytes());
        }
        if to == DType::F32 {
            sink(values).map_err(CopyError::Io)?;
        } else {
            super::cast::cast(DType::F32, to, values, out);
            sink(out).map_err(CopyError::Io)?;
        }
        row += n as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp8_bytes_decode_as_the_formats_define() {
        let e4m3 = table(DType::F8E4M3);
        assert_eq!(e4m3[0x00].to_bits(), 0f32.to_bits());
        assert_eq!(e4m3[0x38].to_bits(), 1f32.to_bits()); // exponent 7 = bias
        assert_eq!(e4m3[0x7e].to_bits(), 448f32.to_bits()); // the largest finite
        assert!(e4m3[0x7f].is_nan() && e4m3[0xff].is_nan());
        assert_eq!(e4m3[0x01].to_bits(), (2f32.powi(-9)).to_bits()); // the smallest subnormal
        assert_eq!(e4m3[0xb8].to_bits(), (-1f32).to_bits());
        let e5m2 = table(DType::F8E5M2);
        assert_eq!(e5m2[0x3c].to_bits(), 1f32.to_bits());
        assert_eq!(e5m2[0x7b].to_bits(), 57344f32.to_bits());
        assert_eq!(e5m2[0x7c].to_bits(), f32::INFINITY.to_bits());
        assert!(e5m2[0x7d].is_nan());
        assert_eq!(e5m2[0x01].to_bits(), (2f32.powi(-16)).to_bits());
    }

    #[test]
    fn blocks_that_do_not_divide_the_shape_take_the_last_partial_block() {
        let b = Fp8Blocks {
            rows: 200,
            cols: 136,
            block_rows: 128,
            block_cols: 128,
            scale_dtype: DType::F32,
            product: DType::F32,
        };
        assert_eq!(b.grid(), (2, 2));
        assert_eq!(b.scale_count(200 * 136 * 3), 12);
    }
}
