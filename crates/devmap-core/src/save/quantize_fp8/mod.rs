//! Quantizing on the way out: a float weight written as DeepSeek/transformers-style
//! fine-grained FP8 (`--quantize fp8-block`), as transformers' own `Fp8Quantize`
//! computes it (`integrations/finegrained_fp8.py`):
//!
//! - the weight in float32, cut in 128×128 tiles (the shape must divide);
//! - per tile `m = max |w|`; `scale = 448 / m` (1 where `m` is 0), in f32 as torch
//!   computes a number over a tensor: `(1 / m) · 448`, rounded twice;
//! - the values `w · scale`, clamped to ±448, rounded to F8_E4M3 (to nearest, ties to
//!   even, as torch's `.to(torch.float8_e4m3fn)`);
//! - `M.weight_scale_inv = 1 / scale` (f32) per tile.
//!
//! Two recipes read the same weight: one writes the values, the other the scales. Each
//! streams one row of tiles (128 rows, as stored) at a time, split among the cores (the
//! tiles' maxima first, then the values; bfloat16 straight from its bits, other dtypes
//! widened to f32 16 rows at a time): memory is one row of tiles a core. The first of
//! the two to run keeps the weight's tile scales (a few bytes per 16,384 values) for
//! the other, which then skips the maxima, or, for the scales, the reading.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use super::copy::{CopyError, Stop, read_exact_at};
use crate::types::DType;
use crate::types::range::ByteRange;

mod made;
#[cfg(test)]
mod tests;

/// The largest F8_E4M3 value (`torch.finfo(torch.float8_e4m3fn).max`).
const FP8_MAX: f32 = 448.0;

/// Which of a quantized weight's two tensors a recipe writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fp8Part {
    /// The F8_E4M3 values, the weight's shape.
    Values,
    /// The F32 `weight_scale_inv`, one per tile.
    Scales,
}

/// A float weight `[rows, cols]` quantized in `block` tiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fp8Out {
    pub rows: u64,
    pub cols: u64,
    pub block: (u64, u64),
    /// The stored dtype (float32, float16 or bfloat16).
    pub from: DType,
    pub part: Fp8Part,
}

impl Fp8Out {
    /// Tiles down and across.
    pub fn grid(&self) -> (u64, u64) {
        (self.rows / self.block.0, self.cols / self.block.1)
    }

    /// The shape the part is written as.
    pub fn shape(&self) -> [u64; 2] {
        match self.part {
            Fp8Part::Values => [self.rows, self.cols],
            Fp8Part::Scales => {
                let (r, c) = self.grid();
                [r, c]
            }
        }
    }

    pub fn dtype(&self) -> DType {
        match self.part {
            Fp8Part::Values => DType::F8E4M3,
            Fp8Part::Scales => DType::F32,
        }
    }

    pub fn output_len(&self) -> u64 {
        self.shape().iter().product::<u64>() * self.dtype().size()
    }
}

/// `x` (finite, |x| ≤ 448) as an F8_E4M3 byte, rounded to nearest, ties to even, as
/// torch converts float32 to `float8_e4m3fn`. Branch-free, so a row of them compiles to
/// vector instructions.
#[inline]
pub fn e4m3fn(x: f32) -> u8 {
    let bits = x.to_bits();
    let sign = ((bits >> 24) & 0x80) as u8;
    let a = f32::from_bits(bits & 0x7FFF_FFFF);
    // Below the smallest normal (2^-6): multiples of 2^-9, rounded to even by adding
    // 2^23 (f32 addition rounds to nearest even); the sum's low mantissa bits are then
    // the multiple (read as bits, not converted: an integer step, which vectorises).
    let subnormal = (a * 512.0 + 8_388_608.0)
        .to_bits()
        .wrapping_sub(8_388_608f32.to_bits());
    // Normal: keep 3 of the 23 mantissa bits, rounding to nearest even (a carry moves
    // into the exponent, as it should); the exponent rebiased from 127 to 7 takes
    // 120 << 3 off the exponent-and-mantissa field.
    let abs = bits & 0x7FFF_FFFF;
    let rounded = (abs + 0x7_FFFF + ((abs >> 20) & 1)) >> 20;
    let normal = rounded.wrapping_sub(120 << 3);
    let code = if abs < (1.0f32 / 64.0).to_bits() {
        subnormal
    } else {
        normal
    };
    sign | code as u8
}

/// Rows widened to f32 at a time within a row of tiles (held as stored, read once):
/// the tiles' maxima are found over the whole row of tiles first, then its values
/// quantized, so the f32 copy is a few rows, not 128.
const CHUNK_ROWS: usize = 16;

/// A weight to quantize, as [`stream`] takes it. `name` names it in errors (a NaN or
/// an infinity, which has no FP8 value).
#[derive(Clone, Copy)]
pub struct Fp8Input<'a> {
    pub name: &'a str,
    pub weight: (&'a File, ByteRange),
    pub layout: Fp8Out,
}

/// `M.weight_scale_inv`'s bytes: the inverse of each tile scale, as float32.
fn inverses(scales: &[f32]) -> Vec<u8> {
    scales
        .iter()
        .flat_map(|s| (1.0 / s).to_le_bytes())
        .collect()
}

/// How a recipe starts: the scales' bytes ready, made by the weight's other recipe
/// (nothing to read), or the rows of tiles to stream with the tile scales known (if
/// any) and the grid to keep for the other recipe (if they are not).
enum Start {
    Ready(Vec<u8>),
    Stream {
        known: Option<Vec<f32>>,
        grid: Option<made::Grid>,
    },
}

impl Start {
    fn of(input: Fp8Input<'_>) -> Start {
        let known = made::take(input);
        match known {
            Some(scales) if input.layout.part == Fp8Part::Scales => Start::Ready(inverses(&scales)),
            known => Start::Stream {
                grid: made::Grid::unless_known(input, known.as_deref()),
                known,
            },
        }
    }
}

/// Reads the weight and hands `sink` the part `layout` names, one row of tiles at a
/// time.
pub fn stream(
    input: Fp8Input<'_>,
    cancel: &dyn Stop,
    sink: &mut dyn FnMut(&[u8]) -> io::Result<()>,
) -> Result<(), CopyError> {
    check(input)?;
    let bands = input.layout.rows / input.layout.block.0;
    match Start::of(input) {
        Start::Ready(bytes) => sink(&bytes).map_err(CopyError::Io),
        Start::Stream { known, grid } => {
            let scales = (known.as_deref(), grid.as_ref());
            stream_bands(input, 0..bands, scales, cancel, sink)?;
            made::keep(input, grid);
            Ok(())
        }
    }
}

/// [`stream`] with the rows of tiles split among `threads` threads, each writing its
/// output in place in `dst` from `dst_offset` on. Returns the bytes written.
pub fn write_in_parallel(
    input: Fp8Input<'_>,
    (dst, dst_offset): (&File, u64),
    threads: u64,
    cancel: &(dyn Stop + Sync),
) -> Result<u64, CopyError> {
    check(input)?;
    let layout = input.layout;
    let bands = layout.rows / layout.block.0;
    match Start::of(input) {
        Start::Ready(bytes) => dst
            .write_all_at(&bytes, dst_offset)
            .map_err(CopyError::Io)?,
        Start::Stream { known, grid } => {
            super::copy::write_parts_in_parallel(
                bands,
                layout.output_len() / bands.max(1),
                threads,
                (dst, dst_offset),
                &|range, sink| {
                    let scales = (known.as_deref(), grid.as_ref());
                    stream_bands(input, range, scales, cancel, sink)
                },
            )?;
            made::keep(input, grid);
        }
    }
    Ok(layout.output_len())
}

fn check(input: Fp8Input<'_>) -> Result<(), CopyError> {
    let l = input.layout;
    let (bm, bn) = l.block;
    if input.weight.1.len != l.rows * l.cols * l.from.size()
        || bm == 0
        || bn == 0
        || !l.rows.is_multiple_of(bm)
        || !l.cols.is_multiple_of(bn)
    {
        return Err(CopyError::Io(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "`{}` is not a [{}, {}] {} weight of whole {bm}×{bn} tiles",
                input.name, l.rows, l.cols, l.from
            ),
        )));
    }
    Ok(())
}

/// The stored elements `raw` (rows from `first_row` on) as f32 in `values`, checked
/// finite.
fn widen(
    input: Fp8Input<'_>,
    raw: &[u8],
    first_row: usize,
    values: &mut Vec<f32>,
) -> Result<(), CopyError> {
    let l = input.layout;
    let size = l.from.size() as usize;
    values.resize(raw.len() / size, 0.0);
    match l.from {
        DType::BF16 => {
            for (v, b) in values.iter_mut().zip(raw.chunks_exact(2)) {
                *v = f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16);
            }
        }
        DType::F16 => {
            for (v, b) in values.iter_mut().zip(raw.chunks_exact(2)) {
                *v = half::f16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        _ => {
            for (v, b) in values.iter_mut().zip(raw.chunks_exact(4)) {
                *v = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
    }
    // A NaN or an infinity has every exponent bit set: an integer test, one
    // vectorised pass without a chain of float additions.
    let bad = values.iter().fold(0u32, |any, v| {
        any | u32::from(v.to_bits() & 0x7F80_0000 == 0x7F80_0000)
    });
    if bad != 0 {
        let at = values.iter().position(|v| !v.is_finite()).unwrap_or(0);
        return Err(CopyError::Io(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "`{}` holds {} at element {}: it has no FP8 value",
                input.name,
                values[at],
                first_row * l.cols as usize + at
            ),
        )));
    }
    Ok(())
}

/// The tile scales of the band of rows from `first` whose stored bytes are `raw`,
/// into `scales` (`values` holds widened rows on the way); every value checked finite.
fn band_scales(
    input: Fp8Input<'_>,
    raw: &[u8],
    first: usize,
    values: &mut Vec<f32>,
    scales: &mut [f32],
) -> Result<(), CopyError> {
    let l = input.layout;
    let (cols, bn) = (l.cols as usize, l.block.1 as usize);
    let tiles = cols / bn;
    let chunk = CHUNK_ROWS * cols * l.from.size() as usize;
    // Each tile's largest |w| over the band's rows, as the bits of a positive f32.
    let mut maxes = vec![0u32; tiles];
    if l.from == DType::BF16 {
        // Straight from the stored halves: |v|'s bits order as |v| does, and a
        // NaN or an infinity has every exponent bit set.
        if bf16_tile_maxima(raw, (cols, bn), &mut maxes) {
            // Said with the element's place by the widening below.
            for (k, part) in raw.chunks(chunk).enumerate() {
                widen(input, part, first + k * CHUNK_ROWS, values)?;
            }
        }
    } else {
        for (k, part) in raw.chunks(chunk).enumerate() {
            widen(input, part, first + k * CHUNK_ROWS, values)?;
            for row in values.chunks_exact(cols) {
                for (m, tile) in maxes.iter_mut().zip(row.chunks_exact(bn)) {
                    // For finite floats |v| orders as its bits do: an integer
                    // maximum, which vectorises.
                    *m = tile
                        .iter()
                        .fold(*m, |a, v| a.max(v.to_bits() & 0x7FFF_FFFF));
                }
            }
        }
    }
    for (scale, &max) in scales.iter_mut().zip(&maxes) {
        let max = f32::from_bits(max);
        // Python's `448 / tensor` is torch's `tensor.reciprocal() * 448`: two
        // roundings, not one division.
        *scale = if max > 0.0 {
            (1.0 / max) * FP8_MAX
        } else {
            1.0
        };
    }
    Ok(())
}

/// Each tile's largest |w| over the bfloat16 rows `raw` (`cols` wide, tiles `bn` wide)
/// into `maxes`, as the bits of a positive f32, straight from the stored halves: |v|'s
/// bits order as |v| does. True when a value is a NaN or an infinity (every exponent bit
/// set). Compiled for AVX-512 and AVX2 too, chosen at run time: integer maxima, the same
/// result on every path.
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512vl+avx2+fma",
    "x86_64+avx2+fma",
    "aarch64+neon"
))]
fn bf16_tile_maxima(raw: &[u8], (cols, bn): (usize, usize), maxes: &mut [u32]) -> bool {
    // A plain loop over whole halves (`[u8; 2]`, which load as one u16): an integer
    // maximum, which the compiler splits into vector lanes (iterator adapters' closures
    // are not inlined into a function compiled for other features).
    let mut top_of_all = 0u16;
    for row in raw.chunks_exact(cols * 2) {
        for (m, tile) in maxes.iter_mut().zip(row.chunks_exact(bn * 2)) {
            let mut top = 0u16;
            for &b in tile.as_chunks::<2>().0 {
                top = top.max(u16::from_le_bytes(b) & 0x7FFF);
            }
            *m = (*m).max(u32::from(top) << 16);
            top_of_all = top_of_all.max(top);
        }
    }
    // A NaN or an infinity has every exponent bit set: |v| ≥ 0x7F80.
    top_of_all >= 0x7F80
}

/// The bfloat16 rows `raw` (finite) quantized tile by tile with `scales` into `out`:
/// widening a bfloat16 is a shift, done in the same loop. Compiled for AVX-512 and AVX2
/// too, chosen at run time; every step is an IEEE operation (a multiply, a clamp, an
/// addition, integer bit work), never fused, so each path gives the same bytes.
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512vl+avx2+fma",
    "x86_64+avx2+fma",
    "aarch64+neon"
))]
fn quantize_bf16(raw: &[u8], (cols, bn): (usize, usize), scales: &[f32], out: &mut [u8]) {
    for (row, dst) in raw.chunks_exact(cols * 2).zip(out.chunks_exact_mut(cols)) {
        for ((tile, dst), &s) in row
            .chunks_exact(bn * 2)
            .zip(dst.chunks_exact_mut(bn))
            .zip(scales)
        {
            for (&b, d) in tile.as_chunks::<2>().0.iter().zip(dst) {
                *d = scaled_e4m3fn(f32::from_bits(u32::from(u16::from_le_bytes(b)) << 16), s);
            }
        }
    }
}

/// [`quantize_bf16`] for rows already widened to f32 (float16 and float32 weights).
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512vl+avx2+fma",
    "x86_64+avx2+fma",
    "aarch64+neon"
))]
fn quantize_f32(values: &[f32], (cols, bn): (usize, usize), scales: &[f32], out: &mut [u8]) {
    for (row, dst) in values.chunks_exact(cols).zip(out.chunks_exact_mut(cols)) {
        for ((tile, dst), &s) in row
            .chunks_exact(bn)
            .zip(dst.chunks_exact_mut(bn))
            .zip(scales)
        {
            for (&v, d) in tile.iter().zip(dst) {
                *d = scaled_e4m3fn(v, s);
            }
        }
    }
}

/// The finite value `v` times its tile's `scale`, clamped to ±448, as F8_E4M3. The
/// clamp is spelled out: `f32::clamp`'s NaN handling keeps the loops that call this at
/// a third of the speed (values here are finite, checked when read).
#[inline]
#[allow(clippy::manual_clamp)]
fn scaled_e4m3fn(v: f32, scale: f32) -> u8 {
    let x = v * scale;
    e4m3fn(if x > FP8_MAX {
        FP8_MAX
    } else if x < -FP8_MAX {
        -FP8_MAX
    } else {
        x
    })
}

/// [`stream`] of the rows of tiles `bands`: each band's tile scales taken from `known`
/// (the whole weight's, made by its other recipe) or computed, and recorded in `grid`
/// when one is given.
fn stream_bands(
    input: Fp8Input<'_>,
    bands: std::ops::Range<u64>,
    (known, grid): (Option<&[f32]>, Option<&made::Grid>),
    cancel: &dyn Stop,
    sink: &mut dyn FnMut(&[u8]) -> io::Result<()>,
) -> Result<(), CopyError> {
    let l = input.layout;
    let (cols, bm, bn) = (l.cols as usize, l.block.0 as usize, l.block.1 as usize);
    let tiles = cols / bn;
    let size = l.from.size() as usize;
    let (mut raw, mut values, mut out) = (Vec::new(), Vec::new(), Vec::new());
    let mut scales = vec![1f32; tiles];
    let chunk = CHUNK_ROWS * cols * size;
    for band in bands {
        if cancel.stop() {
            return Err(CopyError::Cancelled);
        }
        // The band's stored bytes, read once: its tiles' maxima come first, then its
        // values, both from here.
        let first = band as usize * bm;
        raw.resize(bm * cols * size, 0);
        read_exact_at(
            input.weight.0,
            &mut raw,
            input.weight.1.offset + (first * cols * size) as u64,
        )?;
        match known {
            // Made by the weight's other recipe, from the same bytes (checked then).
            Some(known) => {
                let at = band as usize * tiles;
                scales.copy_from_slice(&known[at..at + tiles]);
            }
            None => band_scales(input, &raw, first, &mut values, &mut scales)?,
        }
        if let Some(grid) = grid {
            grid.record(band, &scales);
        }
        if l.part == Fp8Part::Scales {
            sink(&inverses(&scales)).map_err(CopyError::Io)?;
            continue;
        }
        if l.from == DType::BF16 {
            // Straight from the stored halves (checked finite above): widening a
            // bfloat16 is a shift, done in the same loop.
            out.resize(bm * cols, 0);
            quantize_bf16(&raw, (cols, bn), &scales, &mut out);
            sink(&out).map_err(CopyError::Io)?;
            continue;
        }
        for (k, part) in raw.chunks(chunk).enumerate() {
            widen(input, part, first + k * CHUNK_ROWS, &mut values)?;
            out.resize(values.len(), 0);
            quantize_f32(&values, (cols, bn), &scales, &mut out);
            sink(&out).map_err(CopyError::Io)?;
        }
    }
    Ok(())
}
