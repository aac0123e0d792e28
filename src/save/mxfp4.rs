//! MXFP4 dequantization while streaming (gpt-oss: `quantization_config.quant_method ==
//! "mxfp4"`). A fused experts weight `P` is stored as `P_blocks`, U8
//! `[E, rows, G, 16]` holding two FP4 (E2M1) values per byte, the low nibble first, and
//! `P_scales`, U8 `[E, rows, G]`, one E8M0 power-of-two exponent (biased by 127) per
//! group of 32 values. transformers 5.24 (`integrations/mxfp4.py`,
//! `convert_moe_packed_tensors`) dequantizes it in the dtype the model loads: each value
//! is the FP4 table entry in that dtype, times `2^(scale − 127)` — `torch.ldexp`, which
//! multiplies by a float32 power of two (infinite from 2¹²⁸ on, so an all-ones scale byte
//! makes zeros NaN) and rounds the float32 product to the dtype — and the matrix of each
//! expert is transposed: the dequantized `P` is `[E, G·32, rows]`.
//!
//! Every FP4 value times a power of two has at most two significant bits, so the
//! float32 product is exact (or infinite, or NaN), and the one rounding is the
//! conversion to the output dtype, done as torch's `.to()` does it (`save::cast`).
//!
//! Memory: one expert's packed bytes (a quarter of its bfloat16 size: 8.3 MB for
//! gpt-oss-120b's `gate_up_proj`) and a band of output rows; never the whole tensor.

use std::fs::File;
use std::io;

use super::copy::{CopyError, Stop, read_exact_at};
use crate::types::dtype::DType;
use crate::types::range::ByteRange;

/// The FP4 (E2M1) values by nibble, as transformers' `FP4_VALUES`.
const FP4: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// Values per scale group (16 bytes of two nibbles).
pub const GROUP: u64 = 32;

/// Output elements produced per band (a band is whole output rows).
const BAND_ELEMENTS: usize = 1 << 18;

/// The layout of one packed experts weight: `blocks` is `[experts, rows, groups, 16]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mxfp4Layout {
    pub experts: u64,
    pub rows: u64,
    pub groups: u64,
}

impl Mxfp4Layout {
    /// The dequantized shape: each expert's matrix transposed, `[experts, groups·32, rows]`.
    pub fn shape(&self) -> [u64; 3] {
        [self.experts, self.groups * GROUP, self.rows]
    }

    pub fn elements(&self) -> u64 {
        self.experts * self.rows * self.groups * GROUP
    }

    /// Bytes of `P_blocks` and of `P_scales`.
    pub fn packed_bytes(&self) -> (u64, u64) {
        let scales = self.experts * self.rows * self.groups;
        (scales * GROUP / 2, scales)
    }

    /// The most memory [`stream`] holds: one expert's packed bytes and scales, and a
    /// band in float32 and in the output dtype.
    pub fn memory(&self) -> u64 {
        let (blocks, scales) = self.packed_bytes();
        (blocks + scales) / self.experts.max(1) + BAND_ELEMENTS as u64 * 8
    }
}

/// `2^e` as float32, as torch's `pow(2.0, e)` gives it for an int exponent in
/// `[-127, 128]`: exact down to the subnormal 2⁻¹²⁷, infinite at 2¹²⁸.
fn power_of_two(e: i32) -> f32 {
    if e >= 128 {
        f32::INFINITY
    } else if e >= -126 {
        f32::from_bits(((e + 127) as u32) << 23)
    } else {
        // 2^-127: the one subnormal an E8M0 byte can give.
        f32::from_bits(1 << (e + 149))
    }
}

/// Reads `P_blocks` (`blocks`) and `P_scales` (`scales`) and hands `sink` the
/// dequantized `[E, G·32, rows]` tensor converted to `to`, a band of output rows at a
/// time. `name` names `P_blocks` in errors.
pub fn stream(
    name: &str,
    (blocks_file, blocks): (&File, ByteRange),
    (scales_file, scales): (&File, ByteRange),
    layout: Mxfp4Layout,
    to: DType,
    cancel: &dyn Stop,
    sink: &mut dyn FnMut(&[u8]) -> io::Result<()>,
) -> Result<(), CopyError> {
    let (want_blocks, want_scales) = layout.packed_bytes();
    if blocks.len != want_blocks || scales.len != want_scales {
        return Err(CopyError::Io(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "`{name}` holds {} bytes and its scales {}, but {:?} needs {want_blocks} and {want_scales}",
                blocks.len,
                scales.len,
                layout.shape()
            ),
        )));
    }
    let rows = layout.rows as usize;
    let groups = layout.groups as usize;
    let cols = groups * GROUP as usize;
    let expert_blocks = rows * groups * 16;
    let expert_scales = rows * groups;
    let band_rows = (BAND_ELEMENTS / rows.max(1)).clamp(1, cols.max(1));
    let mut packed = vec![0u8; expert_blocks];
    let mut exponents = vec![0u8; expert_scales];
    let mut powers = vec![0f32; expert_scales];
    let mut values = vec![0u8; band_rows * rows * 4];
    let mut output = vec![0u8; band_rows * rows * to.size() as usize];
    for expert in 0..layout.experts {
        if cancel.stop() {
            return Err(CopyError::Cancelled);
        }
        let at = expert * expert_blocks as u64;
        read_exact_at(blocks_file, &mut packed, blocks.offset + at).map_err(|e| match e {
            CopyError::ShortSource { copied } => CopyError::ShortSource {
                copied: at + copied,
            },
            e => e,
        })?;
        read_exact_at(
            scales_file,
            &mut exponents,
            scales.offset + expert * expert_scales as u64,
        )?;
        for (p, &s) in powers.iter_mut().zip(&exponents) {
            *p = power_of_two(i32::from(s) - 127);
        }
        // Output row c is input column c: group c / 32, byte (c % 32) / 2, the low
        // nibble for an even c.
        let mut first = 0;
        while first < cols {
            if cancel.stop() {
                return Err(CopyError::Cancelled);
            }
            let n = band_rows.min(cols - first);
            let band = &mut values[..n * rows * 4];
            for (k, out_row) in band.chunks_exact_mut(rows * 4).enumerate() {
                let c = first + k;
                let (group, within) = (c / GROUP as usize, c % GROUP as usize);
                let (byte, high) = (within / 2, within % 2 == 1);
                for (r, slot) in out_row.chunks_exact_mut(4).enumerate() {
                    let packed_byte = packed[(r * groups + group) * 16 + byte];
                    let nibble = if high {
                        packed_byte >> 4
                    } else {
                        packed_byte & 0x0F
                    };
                    let value = FP4[usize::from(nibble)] * powers[r * groups + group];
                    slot.copy_from_slice(&value.to_le_bytes());
                }
            }
            if to == DType::F32 {
                sink(band).map_err(CopyError::Io)?;
            } else {
                let out = &mut output[..n * rows * to.size() as usize];
                super::cast::cast(DType::F32, to, band, out);
                sink(out).map_err(CopyError::Io)?;
            }
            first += n;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn powers_of_two_cover_every_scale_byte_as_float32_does() {
        for byte in 0u8..=255 {
            let e = i32::from(byte) - 127;
            let want = 2f64.powi(e) as f32;
            assert_eq!(
                power_of_two(e).to_bits(),
                want.to_bits(),
                "scale byte {byte}"
            );
        }
        assert!(power_of_two(128).is_infinite());
        assert!((0.0f32 * power_of_two(128)).is_nan());
    }
}
