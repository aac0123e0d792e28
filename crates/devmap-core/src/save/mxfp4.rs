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
//! gpt-oss-120b's `gate_up_proj`) and 32 output rows; never the whole tensor.

use std::fs::File;
use std::io;

use super::copy::{CopyError, Stop, read_exact_at};
use crate::types::DType;
use crate::types::range::ByteRange;

/// The FP4 (E2M1) values by nibble, as transformers' `FP4_VALUES`.
const FP4: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// Values per scale group (16 bytes of two nibbles).
pub const GROUP: u64 = 32;

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

    /// The dequantized tensor as a LoRA merge sees it: `E·G·32` rows of `rows` values.
    pub fn matrix(&self) -> (u64, u64) {
        (self.experts * self.groups * GROUP, self.rows)
    }

    pub fn elements(&self) -> u64 {
        self.experts * self.rows * self.groups * GROUP
    }

    /// Bytes of `P_blocks` and of `P_scales`.
    pub fn packed_bytes(&self) -> (u64, u64) {
        let scales = self.experts * self.rows * self.groups;
        (scales * GROUP / 2, scales)
    }

    /// The most memory [`stream`] holds: one expert's packed bytes and scales, and 32
    /// output rows (in float32 at most), and the value table.
    pub fn memory(&self) -> u64 {
        let (blocks, scales) = self.packed_bytes();
        (blocks + scales) / self.experts.max(1) + GROUP * self.rows * 4 + 256 * 16 * 4
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

/// Every value an MXFP4 element can take, in `to`'s bytes: entry `scale · 16 + nibble`
/// is `FP4[nibble] × 2^(scale − 127)` computed in float32 and converted as torch's
/// `.to()` converts (the value depends on nothing else, so a lookup is the same
/// arithmetic done once).
fn value_table(to: DType) -> Vec<u8> {
    let values: Vec<u8> = (0..256 * 16)
        .flat_map(|i: i32| (FP4[(i % 16) as usize] * power_of_two(i / 16 - 127)).to_le_bytes())
        .collect();
    if to == DType::F32 {
        return values;
    }
    let mut out = vec![0u8; 256 * 16 * to.size() as usize];
    super::cast::cast(DType::F32, to, &values, &mut out);
    out
}

/// One group of every input row of one expert: what fills 32 output rows.
struct GroupInput<'a> {
    packed: &'a [u8],
    exponents: &'a [u8],
    /// Which group.
    index: usize,
    groups: usize,
    rows: usize,
}

/// Fills `band` (32 output rows of `N`-byte values) from `input`: output row `2b` (and
/// `2b + 1`) at column `r` is the low (high) nibble of byte `b` of input row `r`'s group.
/// Done in 32 × 32 tiles: a tile is built transposed in a small local array (in the L1
/// cache), then each of its rows is one 32-value run of an output row. `N` is a
/// constant so each value is one load and one store.
fn fill_band<const N: usize>(input: &GroupInput<'_>, table: &[u8], band: &mut [u8]) {
    const TILE: usize = GROUP as usize;
    let rows = input.rows;
    let mut tile = [[[0u8; N]; TILE]; TILE];
    for first in (0..rows).step_by(TILE) {
        let n = TILE.min(rows - first);
        // `k` is the tile's column: each input row fills a column, transposed.
        #[allow(clippy::needless_range_loop)]
        for k in 0..n {
            let at = (first + k) * input.groups + input.index;
            let values = &table[usize::from(input.exponents[at]) * 16 * N..][..16 * N];
            let value = |nibble: u8| -> [u8; N] {
                let i = usize::from(nibble) * N;
                let mut v = [0u8; N];
                v.copy_from_slice(&values[i..i + N]);
                v
            };
            let bytes = &input.packed[at * 16..][..16];
            for (b, &byte) in bytes.iter().enumerate() {
                tile[2 * b][k] = value(byte & 0x0F);
                tile[2 * b + 1][k] = value(byte >> 4);
            }
        }
        for (c, values) in tile.iter().enumerate() {
            let at = (c * rows + first) * N;
            for (slot, v) in band[at..at + n * N].chunks_exact_mut(N).zip(values) {
                slot.copy_from_slice(v);
            }
        }
    }
}

/// Reads `input`'s `P_blocks` and `P_scales` and hands `sink` the dequantized
/// `[E, G·32, rows]` tensor converted to `to` (with its LoRA merges applied, where
/// `input.merge` has them), 32 output rows (one group of every input row) at a time.
pub fn stream(
    input: &Packed<'_>,
    to: DType,
    cancel: &dyn Stop,
    sink: &mut dyn FnMut(&[u8]) -> io::Result<()>,
) -> Result<(), CopyError> {
    stream_experts(input, 0..input.layout.experts, to, cancel, sink)
}

/// An MXFP4 weight's packed inputs, as [`stream`] takes them. `name` names `P_blocks`
/// in errors; `merge` holds the LoRA merges into the dequantized weight (rows
/// `E·G·32` of `rows` values, as peft sees the `[E, in, out]` parameter), applied in
/// `to` as each band is made.
#[derive(Clone, Copy)]
pub struct Packed<'a> {
    pub name: &'a str,
    pub blocks: (&'a File, ByteRange),
    pub scales: (&'a File, ByteRange),
    pub layout: Mxfp4Layout,
    pub merge: Option<&'a super::lora_kernel::RowMerger>,
}

/// [`stream`] with the experts split among `threads` threads, each writing its
/// experts' output at its place in `dst` from `dst_offset` on (the dequantization is
/// arithmetic, not I/O: on a big weight it keeps the cores busy). Returns the bytes
/// written.
pub fn write_in_parallel(
    input: Packed<'_>,
    to: DType,
    (dst, dst_offset): (&File, u64),
    threads: u64,
    cancel: &(dyn Stop + Sync),
) -> Result<u64, CopyError> {
    let experts = input.layout.experts;
    let expert_bytes = input.layout.rows * input.layout.groups * GROUP * to.size();
    super::copy::write_parts_in_parallel(
        experts,
        expert_bytes,
        threads,
        (dst, dst_offset),
        &|range, sink| stream_experts(&input, range, to, cancel, sink),
    )?;
    Ok(experts * expert_bytes)
}

/// [`stream`] of the experts `experts` only.
fn stream_experts(
    input: &Packed<'_>,
    experts: std::ops::Range<u64>,
    to: DType,
    cancel: &dyn Stop,
    sink: &mut dyn FnMut(&[u8]) -> io::Result<()>,
) -> Result<(), CopyError> {
    let Packed {
        name,
        blocks: (blocks_file, blocks),
        scales: (scales_file, scales),
        layout,
        merge,
    } = *input;
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
    let size = to.size() as usize;
    let table = value_table(to);
    let rows = layout.rows as usize;
    let groups = layout.groups as usize;
    let expert_blocks = rows * groups * 16;
    let expert_scales = rows * groups;
    let mut packed = vec![0u8; expert_blocks];
    let mut exponents = vec![0u8; expert_scales];
    let mut band = vec![0u8; GROUP as usize * rows * size];
    for expert in experts {
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
        // Output row c is input column c: group c / 32, byte (c % 32) / 2, its low
        // nibble for an even c. One group of every input row fills 32 output rows.
        for group in 0..groups {
            if cancel.stop() {
                return Err(CopyError::Cancelled);
            }
            let input = GroupInput {
                packed: &packed,
                exponents: &exponents,
                index: group,
                groups,
                rows,
            };
            match size {
                2 => fill_band::<2>(&input, &table, &mut band),
                _ => fill_band::<4>(&input, &table, &mut band),
            }
            if let Some(merger) = merge {
                let first = (expert as usize * groups + group) * GROUP as usize;
                merger.merge(first, to, &mut band)?;
            }
            sink(&band).map_err(CopyError::Io)?;
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

    struct Never;
    impl Stop for Never {
        fn stop(&self) -> bool {
            false
        }
    }

    /// The experts split among threads, each written in place, give the bytes of the
    /// one sequential stream (which the tests outside check against the definition and
    /// against transformers), with rows that are not a multiple of the 32-row tile.
    #[test]
    fn parallel_writing_gives_the_sequential_bytes() {
        use std::io::Write;
        let layout = Mxfp4Layout {
            experts: 5,
            rows: 37,
            groups: 2,
        };
        let (nb, ns) = layout.packed_bytes();
        let bytes: Vec<u8> = (0..nb + ns)
            .map(|i| (i * 2_654_435_761 % 251) as u8)
            .collect();
        let mut input = tempfile::tempfile().expect("temp file");
        input.write_all(&bytes).expect("write");
        let blocks = ByteRange {
            file: 0,
            offset: 0,
            len: nb,
        };
        let scales = ByteRange {
            file: 0,
            offset: nb,
            len: ns,
        };
        let packed = Packed {
            name: "w",
            blocks: (&input, blocks),
            scales: (&input, scales),
            layout,
            merge: None,
        };
        for to in [DType::BF16, DType::F16, DType::F32] {
            let mut want = Vec::new();
            stream(&packed, to, &Never, &mut |b| {
                want.extend_from_slice(b);
                Ok(())
            })
            .expect("stream");
            assert_eq!(want.len() as u64, layout.elements() * to.size());
            for threads in [2, 3, 8] {
                let out = tempfile::tempfile().expect("temp file");
                let n = write_in_parallel(packed, to, (&out, 7), threads, &Never).expect("write");
                assert_eq!(n, want.len() as u64);
                let mut got = vec![0u8; want.len()];
                std::os::unix::fs::FileExt::read_exact_at(&out, &mut got, 7).expect("read");
                assert!(got == want, "{to:?} with {threads} threads");
            }
        }
    }
}
