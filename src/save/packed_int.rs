//! compressed-tensors `pack-quantized` integer weights (W4A16, W8A16: llm-compressor's
//! GPTQ and RTN output, Kimi K2's INT4 release) dequantized while streaming, as
//! compressed-tensors' `PackedQuantizationCompressor.decompress` computes them:
//!
//! - `M.weight_packed` (I32 `[rows, ⌈cols·bits/32⌉]`) holds each row's values densely:
//!   value `c` at bit `c·bits` of the row's little-endian words (a value may straddle two
//!   words), stored plus `2^(bits−1)`;
//! - `M.weight_scale` holds one scale per group of `group` columns of a row (`group`),
//!   per row (`channel`), or one for the tensor (`tensor`);
//! - `M.weight_zero_point` (asymmetric only) holds one zero point per scale, packed the
//!   same way but down the rows (I32 `[⌈rows·bits/32⌉, groups]`).
//!
//! `w = (q − z) · s`, the subtraction and the multiply in the scale's dtype (torch's
//! `x_q.to(scale.dtype)`: one rounding of the exact product), then converted to the
//! dtype the model is loaded in. Rows stream a band at a time (a multiple of 32 rows, so
//! a band's zero points are whole words): memory is a few bands, whatever the tensor.

use std::fs::File;
use std::io;

use super::copy::{CopyError, Stop, read_exact_at};
use crate::types::dtype::DType;
use crate::types::range::ByteRange;

/// Output elements per band (before rounding up to 32 rows).
const BAND_ELEMENTS: u64 = 1 << 20;

/// Working memory of one dequantizing stream at most: a band's packed words, values,
/// scale-dtype bytes and output, and its scales and zero points.
pub const BAND_BYTES: u64 = BAND_ELEMENTS * (1 + 4 + 4 + 4) + (1 << 20);

/// A packed integer weight's geometry and scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackedIntLayout {
    /// The dequantized weight's shape, `[rows, cols]`.
    pub rows: u64,
    pub cols: u64,
    /// Bits per value, 1 to 8.
    pub bits: u8,
    /// Columns sharing a scale: the group size, `cols` for one scale per row; 0 for one
    /// scale for the whole tensor.
    pub group: u64,
    pub scale_dtype: DType,
    /// Whether zero points are stored (an asymmetric scheme).
    pub zero_points: bool,
}

impl PackedIntLayout {
    /// I32 words per packed row.
    pub fn packed_cols(&self) -> u64 {
        (self.cols * u64::from(self.bits)).div_ceil(32)
    }

    /// Scales per row (1 for one per row or per tensor).
    pub fn groups(&self) -> u64 {
        match self.group {
            0 => 1,
            g => self.cols / g,
        }
    }

    /// Scales stored.
    pub fn scale_count(&self) -> u64 {
        if self.group == 0 {
            1
        } else {
            self.rows * self.groups()
        }
    }

    /// Rows of I32 words the zero points take (packed down the rows).
    pub fn zero_rows(&self) -> u64 {
        (self.rows * u64::from(self.bits)).div_ceil(32)
    }

    /// Values the weight dequantizes to.
    pub fn elements(&self) -> u64 {
        self.rows * self.cols
    }

    /// The shape written.
    pub fn shape(&self) -> [u64; 2] {
        [self.rows, self.cols]
    }

    /// The offset values are stored plus.
    fn offset(&self) -> i32 {
        1 << (self.bits - 1)
    }
}

/// A packed weight's inputs. `name` names the weight in errors.
pub struct PackedInt<'a> {
    pub name: &'a str,
    pub packed: (&'a File, ByteRange),
    pub scales: (&'a File, ByteRange),
    pub zeros: Option<(&'a File, ByteRange)>,
    pub layout: PackedIntLayout,
    /// LoRA merges into the dequantized weight, applied in `to` to each band as peft
    /// merges into the model transformers loads dequantized.
    pub merge: Option<&'a super::lora_kernel::RowMerger>,
}

fn invalid(message: String) -> CopyError {
    CopyError::Io(io::Error::new(io::ErrorKind::InvalidData, message))
}

/// Bit `at` of a little-endian run of I32 words, `bits` wide: the value there.
fn value_at(word: impl Fn(usize) -> u32, at: u64, bits: u8) -> u32 {
    let mask = (1u32 << bits) - 1;
    let (index, shift) = ((at / 32) as usize, (at % 32) as u32);
    let mut v = word(index) >> shift;
    if shift + u32::from(bits) > 32 {
        v |= word(index + 1) << (32 - shift);
    }
    v & mask
}

fn word_of(bytes: &[u8], i: usize) -> u32 {
    bytes
        .get(i * 4..i * 4 + 4)
        .map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

/// Reads `input`'s packed values, scales and zero points, and hands `sink` the
/// dequantized weight converted to `to`, a band of rows at a time.
pub fn stream(
    input: &PackedInt<'_>,
    to: DType,
    cancel: &dyn Stop,
    sink: &mut dyn FnMut(&[u8]) -> io::Result<()>,
) -> Result<(), CopyError> {
    let layout = input.layout;
    let name = input.name;
    let ssize = layout.scale_dtype.size();
    if input.packed.1.len != layout.rows * layout.packed_cols() * 4 {
        return Err(invalid(format!(
            "`{name}` holds {} bytes, but [{}, {}] values of {} bits pack into {} I32 words a row",
            input.packed.1.len,
            layout.rows,
            layout.cols,
            layout.bits,
            layout.packed_cols()
        )));
    }
    if input.scales.1.len != layout.scale_count() * ssize {
        return Err(invalid(format!(
            "the scales of `{name}` hold {} bytes, but {} {} scales are needed",
            input.scales.1.len,
            layout.scale_count(),
            layout.scale_dtype
        )));
    }
    if let Some((_, z)) = input.zeros
        && z.len != layout.zero_rows() * layout.groups() * 4
    {
        return Err(invalid(format!(
            "the zero points of `{name}` hold {} bytes, but [{}, {}] I32 words are needed",
            z.len,
            layout.zero_rows(),
            layout.groups()
        )));
    }
    let cols = layout.cols as usize;
    let band_rows = ((BAND_ELEMENTS / layout.cols.max(1)) / 32 * 32).max(32);
    let packed_row = layout.packed_cols() as usize * 4;
    let groups = layout.groups() as usize;
    let mut packed = Vec::new();
    let mut scale_bytes = Vec::new();
    let mut scales: Vec<f32> = Vec::new();
    let mut zero_words = Vec::new();
    let mut stored = Vec::new();
    let mut output = Vec::new();
    let offset = layout.offset();
    let mut r0 = 0;
    while r0 < layout.rows {
        if cancel.stop() {
            return Err(CopyError::Cancelled);
        }
        let r1 = (r0 + band_rows).min(layout.rows);
        let band = (r1 - r0) as usize;
        packed.resize(band * packed_row, 0);
        read_exact_at(
            input.packed.0,
            &mut packed,
            input.packed.1.offset + r0 * packed_row as u64,
        )?;
        // This band's scales (or the tensor's one), as f32.
        let (first_scale, count) = if layout.group == 0 {
            (0, 1)
        } else {
            (r0 * groups as u64, band * groups)
        };
        scale_bytes.resize(count * ssize as usize, 0);
        read_exact_at(
            input.scales.0,
            &mut scale_bytes,
            input.scales.1.offset + first_scale * ssize,
        )?;
        scales.resize(count, 0.0);
        let mut wide = vec![0u8; count * 4];
        super::cast::cast(layout.scale_dtype, DType::F32, &scale_bytes, &mut wide);
        for (s, b) in scales.iter_mut().zip(wide.chunks_exact(4)) {
            *s = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
        if let Some(bad) = scales.iter().position(|s| !s.is_finite()) {
            return Err(invalid(format!(
                "the scales of `{name}` hold {} at element {}: the weight cannot be dequantized",
                scales[bad],
                first_scale + bad as u64
            )));
        }
        // The zero-point words of rows r0..r1 (r0 is a multiple of 32: whole words).
        let first_word_row = r0 * u64::from(layout.bits) / 32;
        let word_rows = ((r1 * u64::from(layout.bits)).div_ceil(32) - first_word_row) as usize;
        if let Some((file, z)) = input.zeros {
            zero_words.resize(word_rows * groups * 4, 0);
            read_exact_at(
                file,
                &mut zero_words,
                z.offset + first_word_row * groups as u64 * 4,
            )?;
        }
        // Each value in the scale's dtype (f32 here; rounded to it below).
        stored.resize(band * cols, 0f32);
        for i in 0..band {
            let row = &packed[i * packed_row..(i + 1) * packed_row];
            let out = &mut stored[i * cols..(i + 1) * cols];
            for (c, slot) in out.iter_mut().enumerate() {
                let q = value_at(
                    |w| word_of(row, w),
                    c as u64 * u64::from(layout.bits),
                    layout.bits,
                ) as i32
                    - offset;
                let g = if layout.group == 0 {
                    0
                } else {
                    c / layout.group as usize
                };
                let s = if layout.group == 0 {
                    scales[0]
                } else {
                    scales[i * groups + g]
                };
                let z = if input.zeros.is_some() {
                    // Column g of the zero-point words, row r0 + i of its bit stream.
                    let word = |w: usize| word_of(&zero_words, w * groups + g);
                    value_at(word, i as u64 * u64::from(layout.bits), layout.bits) as i32 - offset
                } else {
                    0
                };
                // q − z is a small integer, exact in every float dtype; the product of
                // two values of at most 11 significant bits each is exact in f32.
                *slot = (q - z) as f32 * s;
            }
        }
        // Rounded once to the scale's dtype (torch's multiply in that dtype), then
        // converted to `to` as `.to(dtype)` does.
        let in_scale_dtype: Vec<u8> = match layout.scale_dtype {
            DType::BF16 => stored
                .iter()
                .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
                .collect(),
            DType::F16 => stored
                .iter()
                .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
                .collect(),
            _ => stored.iter().flat_map(|v| v.to_le_bytes()).collect(),
        };
        let out: &mut [u8] = if layout.scale_dtype == to {
            output = in_scale_dtype;
            &mut output
        } else {
            output.resize(band * cols * to.size() as usize, 0);
            super::cast::cast(layout.scale_dtype, to, &in_scale_dtype, &mut output);
            &mut output
        };
        if let Some(merge) = input.merge {
            merge.merge(r0 as usize, to, out)?;
        }
        sink(out).map_err(CopyError::Io)?;
        r0 = r1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// compressed-tensors' `pack_to_int32` of one row, written plainly: value `i` at bit
    /// `i·bits`, stored plus `2^(bits−1)`.
    fn pack(values: &[i32], bits: u8) -> Vec<u32> {
        let mut words = vec![0u32; (values.len() * bits as usize).div_ceil(32)];
        for (i, v) in values.iter().enumerate() {
            let u = (v + (1 << (bits - 1))) as u64;
            let at = i as u64 * u64::from(bits);
            let (w, s) = ((at / 32) as usize, at % 32);
            words[w] |= (u << s) as u32;
            if s + u64::from(bits) > 32 {
                words[w + 1] |= (u >> (32 - s)) as u32;
            }
        }
        words
    }

    #[test]
    fn values_straddling_words_unpack_for_every_width() {
        for bits in 1..=8u8 {
            let half = 1i32 << (bits - 1);
            let values: Vec<i32> = (0..70).map(|i| (i * 5 % (2 * half)) - half).collect();
            let words = pack(&values, bits);
            for (i, v) in values.iter().enumerate() {
                let got = value_at(
                    |w| words.get(w).copied().unwrap_or(0),
                    i as u64 * u64::from(bits),
                    bits,
                ) as i32
                    - half;
                assert_eq!(got, *v, "bits {bits}, value {i}");
            }
        }
    }
}
