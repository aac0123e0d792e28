//! compressed-tensors `nvfp4-pack-quantized` weights (llm-compressor's NVFP4 and
//! NVFP4A16) dequantized while streaming, as compressed-tensors'
//! `NVFP4PackedCompressor.decompress` computes them on CPU:
//!
//! - `M.weight_packed` (U8 `[rows, cols/2]`) holds two FP4 E2M1 values a byte, the low
//!   nibble first: sign bit 8, magnitudes 0, ½, 1, 1½, 2, 3, 4, 6;
//! - `M.weight_scale` (F8_E4M3 `[rows, cols/16]`) one scale per 16 values of a row;
//! - `M.weight_global_scale` (F32 `[1]`) the tensor's global scale, stored inverted:
//!   each block's scale is divided by it.
//!
//! `w = bf16(fp4 · (f32(s) / g))`: the division and the product in f32, each rounded
//! once, then the product rounded to bfloat16 (the dtype compressed-tensors unpacks
//! to), then converted to the dtype the model is loaded in. Rows stream a band at a
//! time, split among the cores when written to a file.
//!
//! NVIDIA ModelOpt's NVFP4 (`quant_algo: NVFP4`) stores the same values and block
//! scales as `M.weight` and `M.weight_scale`, its global scale `M.weight_scale_2` not
//! inverted: `w = fp4 · (f32(s) · g)`, both products in f32, rounded once to the output
//! dtype, as ModelOpt's `NVFP4QTensor.dequantize` computes it ([`Nvfp4Convention`]).

use std::fs::File;
use std::io;

use super::copy::{CopyError, Stop, invalid_data as invalid, read_exact_at};
use crate::types::dtype::DType;
use crate::types::range::ByteRange;

/// Values a scale covers.
pub const GROUP: u64 = 16;

/// Output elements per band.
const BAND_ELEMENTS: u64 = 1 << 20;

/// Working memory of one dequantizing stream at most: a band's packed bytes, scales and
/// output (up to float32).
pub const BAND_BYTES: u64 = BAND_ELEMENTS / 2 + BAND_ELEMENTS / GROUP + BAND_ELEMENTS * 4;

/// FP4 E2M1's sixteen codes: bit 8 the sign, then the magnitudes 0, ½, 1, 1½, 2, 3,
/// 4, 6 (code 8 is −0, as compressed-tensors' `magnitude · −1` makes it).
const SIGNED_E2M1: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// ModelOpt's E2M1 table (`NVFP4QTensor.get_e2m1_values`): code 8 is +0.
const MODELOPT_E2M1: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// A finite (or infinite) f32 rounded to bfloat16 as torch rounds it: to nearest, ties
/// to even. The products here are never NaN: their scales were checked.
fn bf16_bits(x: f32) -> u16 {
    let bits = x.to_bits();
    (bits.wrapping_add(0x7FFF + ((bits >> 16) & 1)) >> 16) as u16
}

/// Whose NVFP4 a weight is: how its global scale applies, and where the product is
/// rounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nvfp4Convention {
    /// compressed-tensors: `bf16(fp4 · (f32(s) / g))`, the global scale stored inverted,
    /// the product rounded to bfloat16 (the dtype it unpacks to) before the output's.
    CompressedTensors,
    /// NVIDIA ModelOpt (`quant_algo: NVFP4`): `fp4 · (f32(s) · g)` in f32, `g` its
    /// `weight_scale_2`, rounded once, to the output dtype (`NVFP4QTensor.dequantize`).
    ModelOpt,
}

/// An NVFP4 weight's dequantized shape, `[rows, cols]`, and whose it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Nvfp4Layout {
    pub rows: u64,
    pub cols: u64,
    pub convention: Nvfp4Convention,
}

impl Nvfp4Layout {
    pub fn elements(&self) -> u64 {
        self.rows * self.cols
    }

    pub fn shape(&self) -> [u64; 2] {
        [self.rows, self.cols]
    }
}

/// An NVFP4 weight's inputs. `name` names the weight in errors.
pub struct Nvfp4<'a> {
    pub name: &'a str,
    pub packed: (&'a File, ByteRange),
    pub scales: (&'a File, ByteRange),
    pub global: (&'a File, ByteRange),
    pub layout: Nvfp4Layout,
    /// LoRA merges into the dequantized weight, applied in `to` to each band.
    pub merge: Option<&'a super::lora_kernel::RowMerger>,
}

/// The sizes checked, and the global scale read (finite and not zero).
fn check(input: &Nvfp4<'_>) -> Result<f32, CopyError> {
    let layout = input.layout;
    let name = input.name;
    if input.packed.1.len != layout.elements() / 2 || !layout.cols.is_multiple_of(GROUP) {
        return Err(invalid(format!(
            "`{name}` holds {} bytes, but [{}, {}] FP4 values in groups of {GROUP} take {}",
            input.packed.1.len,
            layout.rows,
            layout.cols,
            layout.elements() / 2
        )));
    }
    if input.scales.1.len != layout.elements() / GROUP {
        return Err(invalid(format!(
            "the scales of `{name}` hold {} bytes, but {} F8_E4M3 scales are needed",
            input.scales.1.len,
            layout.elements() / GROUP
        )));
    }
    if input.global.1.len != 4 {
        return Err(invalid(format!(
            "the global scale of `{name}` holds {} bytes, not one float32",
            input.global.1.len
        )));
    }
    let mut bytes = [0u8; 4];
    read_exact_at(input.global.0, &mut bytes, input.global.1.offset)?;
    let global = f32::from_le_bytes(bytes);
    if !global.is_finite() || global == 0.0 {
        return Err(invalid(format!(
            "the global scale of `{name}` is {global}: the weight cannot be dequantized"
        )));
    }
    Ok(global)
}

/// Hands `sink` the dequantized weight converted to `to`, a band of rows at a time.
pub fn stream(
    input: &Nvfp4<'_>,
    to: DType,
    cancel: &dyn Stop,
    sink: &mut dyn FnMut(&[u8]) -> io::Result<()>,
) -> Result<(), CopyError> {
    let global = check(input)?;
    stream_rows(input, global, 0..input.layout.rows, to, cancel, sink)
}

/// [`stream`] with the rows split among `threads` threads, each writing its rows'
/// output in place in `dst` from `dst_offset` on. Returns the bytes written.
pub fn write_in_parallel(
    input: &Nvfp4<'_>,
    to: DType,
    (dst, dst_offset): (&File, u64),
    threads: u64,
    cancel: &(dyn Stop + Sync),
) -> Result<u64, CopyError> {
    let global = check(input)?;
    let layout = input.layout;
    super::copy::write_parts_in_parallel(
        layout.rows,
        layout.cols * to.size(),
        threads,
        (dst, dst_offset),
        &|rows, sink| stream_rows(input, global, rows, to, cancel, sink),
    )?;
    Ok(layout.elements() * to.size())
}

fn stream_rows(
    input: &Nvfp4<'_>,
    global: f32,
    rows: std::ops::Range<u64>,
    to: DType,
    cancel: &dyn Stop,
    sink: &mut dyn FnMut(&[u8]) -> io::Result<()>,
) -> Result<(), CopyError> {
    let layout = input.layout;
    let cols = layout.cols as usize;
    let groups = cols / GROUP as usize;
    let size = to.size() as usize;
    let step = (BAND_ELEMENTS / layout.cols.max(1)).max(1);
    let fp8 = super::fp8::e4m3_values();
    let (mut packed, mut scales, mut output) = (Vec::new(), Vec::new(), Vec::new());
    let mut r0 = rows.start;
    while r0 < rows.end {
        if cancel.stop() {
            return Err(CopyError::Cancelled);
        }
        let r1 = (r0 + step).min(rows.end);
        let n = (r1 - r0) as usize;
        packed.resize(n * cols / 2, 0);
        read_exact_at(
            input.packed.0,
            &mut packed,
            input.packed.1.offset + r0 * layout.cols / 2,
        )?;
        scales.resize(n * groups, 0);
        read_exact_at(
            input.scales.0,
            &mut scales,
            input.scales.1.offset + r0 * groups as u64,
        )?;
        output.resize(n * cols * size, 0);
        for i in 0..n {
            let row = &packed[i * cols / 2..(i + 1) * cols / 2];
            let out = &mut output[i * cols * size..(i + 1) * cols * size];
            for g in 0..groups {
                let code = scales[i * groups + g];
                let s = fp8[usize::from(code)];
                if !s.is_finite() {
                    return Err(invalid(format!(
                        "the scales of `{}` hold NaN at element {}: the weight cannot be dequantized",
                        input.name,
                        (r0 as usize + i) * groups + g
                    )));
                }
                let bytes = &row[g * 8..(g + 1) * 8];
                let dst = &mut out[g * 16 * size..(g + 1) * 16 * size];
                if layout.convention == Nvfp4Convention::ModelOpt {
                    // One f32 product, rounded once to the output dtype.
                    let scale = s * global;
                    let value = |code: u8| MODELOPT_E2M1[usize::from(code)] * scale;
                    let values = bytes.iter().flat_map(|b| [value(b & 0xF), value(b >> 4)]);
                    for (v, o) in values.zip(dst.chunks_exact_mut(size)) {
                        let bits = match to {
                            DType::BF16 => u32::from(bf16_bits(v)),
                            DType::F16 => u32::from(half::f16::from_f32(v).to_bits()),
                            _ => v.to_bits(),
                        };
                        o.copy_from_slice(&bits.to_le_bytes()[..size]);
                    }
                    continue;
                }
                let scale = s / global;
                // Each value's product in f32, rounded to bfloat16, then converted.
                let rounded = |code: u8| bf16_bits(SIGNED_E2M1[usize::from(code)] * scale);
                match to {
                    DType::BF16 => {
                        for (b, pair) in bytes.iter().zip(dst.chunks_exact_mut(4)) {
                            pair[..2].copy_from_slice(&rounded(b & 0xF).to_le_bytes());
                            pair[2..].copy_from_slice(&rounded(b >> 4).to_le_bytes());
                        }
                    }
                    DType::F16 => {
                        let half = |code: u8| {
                            half::f16::from_f32(f32::from_bits(u32::from(rounded(code)) << 16))
                                .to_bits()
                        };
                        for (b, pair) in bytes.iter().zip(dst.chunks_exact_mut(4)) {
                            pair[..2].copy_from_slice(&half(b & 0xF).to_le_bytes());
                            pair[2..].copy_from_slice(&half(b >> 4).to_le_bytes());
                        }
                    }
                    _ => {
                        for (b, pair) in bytes.iter().zip(dst.chunks_exact_mut(8)) {
                            let (lo, hi) = (rounded(b & 0xF), rounded(b >> 4));
                            pair[..4].copy_from_slice(&(u32::from(lo) << 16).to_le_bytes());
                            pair[4..].copy_from_slice(&(u32::from(hi) << 16).to_le_bytes());
                        }
                    }
                }
            }
        }
        if let Some(merge) = input.merge {
            merge.merge(r0 as usize, to, &mut output)?;
        }
        sink(&output).map_err(CopyError::Io)?;
        r0 = r1;
    }
    Ok(())
}
