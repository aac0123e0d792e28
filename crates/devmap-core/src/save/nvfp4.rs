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
use super::lookup::expand_nibbles;
use crate::types::DType;
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
    super::cast::bf16_of_finite(x.to_bits())
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

/// How one block of 16 values is made: the 16 outputs its codes can have, computed
/// from its scale as the convention says, then looked up per nibble.
struct Block {
    convention: Nvfp4Convention,
    global: f32,
    to: DType,
}

impl Block {
    /// The 16 outputs of a block of scale `s`, one per code (elements of `SIZE` bytes).
    fn table<const SIZE: usize>(&self, s: f32) -> [[u8; SIZE]; 16] {
        let mut table = [[0u8; SIZE]; 16];
        // Each (convention, dtype) pair its own loop, so the 16 products vectorize.
        let t = &mut table;
        let bf16_then_f16 = |v: f32| {
            u32::from(half::f16::from_f32(f32::from_bits(u32::from(bf16_bits(v)) << 16)).to_bits())
        };
        match (self.convention, self.to) {
            // ModelOpt: one f32 product, rounded once to the output dtype.
            (Nvfp4Convention::ModelOpt, DType::BF16) => {
                fill(t, &MODELOPT_E2M1, s * self.global, |v| {
                    u32::from(bf16_bits(v))
                });
            }
            (Nvfp4Convention::ModelOpt, DType::F16) => {
                fill(t, &MODELOPT_E2M1, s * self.global, |v| {
                    u32::from(half::f16::from_f32(v).to_bits())
                });
            }
            (Nvfp4Convention::ModelOpt, _) => {
                fill(t, &MODELOPT_E2M1, s * self.global, f32::to_bits);
            }
            // compressed-tensors: the product in f32, rounded to bfloat16, then converted.
            (Nvfp4Convention::CompressedTensors, DType::BF16) => {
                fill(t, &SIGNED_E2M1, s / self.global, |v| {
                    u32::from(bf16_bits(v))
                });
            }
            (Nvfp4Convention::CompressedTensors, DType::F16) => {
                fill(t, &SIGNED_E2M1, s / self.global, bf16_then_f16);
            }
            (Nvfp4Convention::CompressedTensors, _) => {
                fill(t, &SIGNED_E2M1, s / self.global, |v| {
                    u32::from(bf16_bits(v)) << 16
                });
            }
        }
        table
    }

    /// [`Block::table`] of each of the 256 F8_E4M3 scale codes (a block's outputs are a
    /// function of its scale's code, the global scale fixed): 8 KiB for bfloat16 made
    /// once a stream, then each value is one lookup. A NaN code's table is never used.
    fn tables<const SIZE: usize>(&self) -> Vec<[[u8; SIZE]; 16]> {
        let fp8 = super::fp8::e4m3_values();
        fp8.iter()
            .map(|&s| {
                if s.is_finite() {
                    self.table(s)
                } else {
                    [[0; SIZE]; 16]
                }
            })
            .collect()
    }
}

/// Every block's outputs, by scale code, in the output's element size.
enum Tables {
    Two(Vec<[[u8; 2]; 16]>),
    Four(Vec<[[u8; 4]; 16]>),
}

/// `table[code]` = the output bits of `values[code] · scale`.
#[inline]
fn fill<const SIZE: usize>(
    table: &mut [[u8; SIZE]; 16],
    values: &[f32; 16],
    scale: f32,
    bits: impl Fn(f32) -> u32,
) {
    for (entry, v) in table.iter_mut().zip(values) {
        entry.copy_from_slice(&bits(v * scale).to_le_bytes()[..SIZE]);
    }
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
    let block = Block {
        convention: layout.convention,
        global,
        to,
    };
    let tables = match size {
        2 => Tables::Two(block.tables()),
        _ => Tables::Four(block.tables()),
    };
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
            let codes = &scales[i * groups..(i + 1) * groups];
            for (g, (bytes, &code)) in row.chunks_exact(GROUP as usize / 2).zip(codes).enumerate() {
                if !fp8[usize::from(code)].is_finite() {
                    return Err(invalid(format!(
                        "the scales of `{}` hold NaN at element {}: the weight cannot be dequantized",
                        input.name,
                        (r0 as usize + i) * groups + g
                    )));
                }
                let dst = &mut out[g * 16 * size..(g + 1) * 16 * size];
                match &tables {
                    Tables::Two(t) => expand_nibbles(bytes, &t[usize::from(code)], dst),
                    Tables::Four(t) => expand_nibbles(bytes, &t[usize::from(code)], dst),
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
