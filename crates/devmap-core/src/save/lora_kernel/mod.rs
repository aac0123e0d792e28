//! LoRA merges as peft computes them on the CPU (`merge_and_unload`), streamed by
//! blocks of whole rows: memory is the adapter pair in f32 plus one block, never a
//! whole weight. The saver writes what [`stream`] yields and `devmap verify` hashes it,
//! so both compute a merged value the same way.
//!
//! The delta of a row is `scale · Σ_k P[i][k]·Q[k][j]`, summed over the rank in order
//! as fused multiply-adds, which is how torch's CPU matmul sums it with MKL's FMA GEMM
//! on x86-64 (within one ulp, ≥ 99.5% bit-identical: the real-peft test checks). A BLAS
//! that does not fuse (MKL_CBWR=COMPATIBLE) rounds each product; devmap's sum is then
//! the more exact one (docs/guide.md gives the bound CI checks). The loops over output
//! columns are vectorised (AVX2+FMA where the CPU has it, chosen at run time by the
//! `multiversion` crate); the rank loop stays sequential. A general GEMM crate would
//! reorder the sum and lose bit-equality.
//!
//! The pieces: `delta` holds the arithmetic (a step's delta, row by row or four rows
//! at once, and how each kind adds it), `factors` reads an adapter's matrices into
//! the layout that arithmetic wants, and this module streams a tensor's rows through
//! them, checks the result and converts it to the output dtype.

use std::fs::File;
use std::io;

use half::f16;

use super::copy::{CopyError, Stop, read_exact_at};
use crate::model::checkpoint::{Checkpoint, TensorId};
use crate::types::DType;
use crate::types::range::FileId;

mod delta;
mod factors;
#[cfg(test)]
mod tests;

use delta::{Loaded, ROWS, apply_rows};
use factors::load;

/// Bytes of f32 rows processed at a time (at least one row): small enough that a
/// block stays in the CPU's cache through every step.
const BLOCK_BYTES: usize = 256 << 10;

/// Buffers of finished merges, kept for the next: a fresh allocation per tensor costs
/// page faults and zeroing that showed as a sixth of a merge's time.
static SPARE: std::sync::Mutex<Vec<Buffers>> = std::sync::Mutex::new(Vec::new());

#[derive(Default)]
struct Buffers {
    raw: Vec<u8>,
    values: Vec<f32>,
    scratch: Vec<f32>,
    out: Vec<u8>,
}

impl Buffers {
    fn take() -> Buffers {
        SPARE
            .lock()
            .ok()
            .and_then(|mut spare| spare.pop())
            .unwrap_or_default()
    }

    fn give_back(self) {
        if let Ok(mut spare) = SPARE.lock()
            && spare.len() < 8
        {
            spare.push(self);
        }
    }
}

/// `v` with at least `n` elements (grown once, never shrunk).
fn at_least<T: Default + Clone>(v: &mut Vec<T>, n: usize) -> &mut [T] {
    if v.len() < n {
        v.resize(n, T::default());
    }
    &mut v[..n]
}

/// What a merge reads: tensor `id` of `ckpt`, stored as `dtypes.0` at `src` (file,
/// offset; `len` bytes), written as `dtypes.1`; `open` opens an adapter's weight file,
/// `cancel` says when to stop.
#[derive(Clone, Copy)]
pub struct MergeInput<'a> {
    pub ckpt: &'a Checkpoint,
    pub id: TensorId,
    pub src: (&'a File, u64),
    pub len: u64,
    pub dtypes: (DType, DType),
    pub open: &'a (dyn Fn(FileId) -> io::Result<File> + Sync),
    pub cancel: &'a (dyn Stop + Sync),
    /// For an FP8 weight (`dtypes.0`): its block scales. The weight is dequantized and
    /// rounded to `dtypes.1` first — what transformers loads — and merged in that dtype.
    pub dequant: Option<&'a super::fp8::Fp8Rows>,
}

/// Streams the merged value of `input`'s tensor, converted to its output dtype, into
/// `sink` one block of rows at a time.
pub fn stream(
    input: MergeInput<'_>,
    sink: &mut dyn FnMut(&[u8]) -> io::Result<()>,
) -> Result<(), CopyError> {
    let (rows, cols) = layout(&input)?;
    stream_rows(input, ((rows, cols), 0..rows), sink)
}

/// Writes the merged value of `input`'s tensor at `(dst, dst_offset)`, its rows split
/// among `threads` threads (each reads, merges and writes its own rows in place), and
/// returns the bytes written. The value is the one [`stream`] yields.
pub fn write_in_parallel(
    input: MergeInput<'_>,
    (dst, dst_offset): (&File, u64),
    threads: usize,
) -> Result<u64, CopyError> {
    let (rows, cols) = layout(&input)?;
    let out_row = (cols * input.dtypes.1.size() as usize) as u64;
    super::copy::write_parts_in_parallel(
        rows as u64,
        out_row,
        threads as u64,
        (dst, dst_offset),
        &|range, sink| {
            let range = range.start as usize..range.end as usize;
            stream_rows(input, ((rows, cols), range), sink)
        },
    )?;
    Ok(rows as u64 * out_row)
}

/// `(rows, cols)` of a merged tensor's values, checked against its stored length.
fn layout(input: &MergeInput<'_>) -> Result<(usize, usize), CopyError> {
    let tensor = &input.ckpt.tensors()[input.id];
    let dims: Vec<u64> = tensor.shape.iter().collect();
    let (rows, stored) = match dims.as_slice() {
        [n] => (1, *n as usize),
        [r, c] => (*r as usize, *c as usize),
        // Fused experts `[E, out, in]`: E·out rows of `in`.
        [lead @ .., c] if !lead.is_empty() => (lead.iter().product::<u64>() as usize, *c as usize),
        _ => (1, tensor.numel() as usize),
    };
    // Packed FP4 (two values a byte) holds twice the values its shape says.
    let cols = if packed_fp4(input) {
        stored * 2
    } else {
        stored
    };
    let need = rows * row_bytes(input, cols);
    if need as u64 != input.len {
        return Err(CopyError::Io(io::Error::other(format!(
            "tensor `{}` holds {} bytes, its shape needs {need}",
            tensor.name, input.len
        ))));
    }
    Ok((rows, cols))
}

/// Whether the merged weight is DeepSeek-V4's packed FP4 (I8, dequantized with its
/// block scales).
fn packed_fp4(input: &MergeInput<'_>) -> bool {
    input.dequant.is_some() && input.dtypes.0 == DType::I8
}

/// Bytes a stored row of `cols` values takes.
fn row_bytes(input: &MergeInput<'_>, cols: usize) -> usize {
    match input.dequant {
        Some(_) => super::fp8::row_bytes(input.dtypes.0, cols as u64) as usize,
        None => cols * input.dtypes.0.size() as usize,
    }
}

/// The merge of rows `range` of `input`'s tensor (laid out as [`layout`] says),
/// streamed in order.
fn stream_rows(
    input: MergeInput<'_>,
    ((rows, cols), range): ((usize, usize), std::ops::Range<usize>),
    sink: &mut dyn FnMut(&[u8]) -> io::Result<()>,
) -> Result<(), CopyError> {
    let MergeInput {
        ckpt,
        id,
        src: (src, offset),
        dtypes: (from, to),
        open,
        cancel,
        dequant,
        ..
    } = input;
    // The dtype the merge works in: the stored one, or for an FP8 weight the one it
    // is dequantized to.
    let work = if dequant.is_some() { to } else { from };
    let steps: Vec<Loaded> = ckpt
        .merges_of(id)
        .iter()
        .map(|s| load(s, rows, cols, open))
        .collect::<Result<_, _>>()
        .map_err(CopyError::Io)?;
    let stored_row = row_bytes(&input, cols);
    let block_rows = (BLOCK_BYTES / (cols.max(1) * 4)).max(1);
    let allow_nonfinite = ckpt.merges_of(id).iter().all(|s| s.allow_nonfinite);
    let mut buffers = Buffers::take();
    let result = (|| {
        let Buffers {
            raw,
            values,
            scratch,
            out,
        } = &mut buffers;
        let scratch = at_least(scratch, ROWS * cols);
        let mut row = range.start;
        while row < range.end {
            if cancel.stop() {
                return Err(CopyError::Cancelled);
            }
            let n = block_rows.min(range.end - row);
            let bytes = at_least(raw, n * stored_row);
            read_exact_at(src, bytes, offset + (row * stored_row) as u64)?;
            let block = at_least(values, n * cols);
            let base: &mut [u8] = if let Some(fp8) = dequant {
                fp8.values(row as u64, bytes, block);
                for v in block.iter_mut() {
                    *v = round_to(work, *v);
                }
                let base = at_least(out, n * cols * work.size() as usize);
                narrow(work, block, base);
                base
            } else {
                widen(from, bytes, block);
                bytes
            };
            for step in &steps {
                apply_rows(step, (row, cols), block, scratch, work);
            }
            if !allow_nonfinite {
                refuse_overflow(
                    &ckpt.tensors()[id].name,
                    (work, to),
                    base,
                    block,
                    row * cols,
                )?;
            }
            narrow(work, block, base);
            if to == work {
                sink(base).map_err(CopyError::Io)?;
            } else {
                let converted = at_least(out, n * cols * to.size() as usize);
                super::cast::cast(from, to, bytes, converted);
                sink(converted).map_err(CopyError::Io)?;
            }
            row += n;
        }
        Ok(())
    })();
    buffers.give_back();
    result
}

/// A tensor's LoRA merges, loaded, for rows another stream makes: an MXFP4 weight's
/// dequantized rows (`save::mxfp4`), merged as peft merges into the model transformers
/// loads dequantized. The tensor is `rows × cols` as the merge sees it.
pub struct RowMerger {
    name: String,
    steps: Vec<Loaded>,
    allow_nonfinite: bool,
    cols: usize,
}

impl RowMerger {
    /// Reads the adapter matrices of every merge into tensor `id`.
    pub fn load(
        ckpt: &Checkpoint,
        id: TensorId,
        (rows, cols): (u64, u64),
        open: &(dyn Fn(FileId) -> io::Result<File> + Sync),
    ) -> Result<RowMerger, CopyError> {
        let (rows, cols) = (rows as usize, cols as usize);
        let merges = ckpt.merges_of(id);
        let steps = merges
            .iter()
            .map(|s| load(s, rows, cols, open))
            .collect::<Result<_, _>>()
            .map_err(CopyError::Io)?;
        Ok(RowMerger {
            name: ckpt.tensors()[id].name.to_string(),
            steps,
            allow_nonfinite: merges.iter().all(|s| s.allow_nonfinite),
            cols,
        })
    }

    /// Merges into `rows` (whole rows of `dtype`, the first of them row `first`), in
    /// place, in that dtype.
    pub fn merge(&self, first: usize, dtype: DType, rows: &mut [u8]) -> Result<(), CopyError> {
        // The kept buffers, as a streamed merge uses them: a band is merged per call.
        let mut buffers = Buffers::take();
        let values = at_least(&mut buffers.values, rows.len() / dtype.size() as usize);
        let scratch = at_least(&mut buffers.scratch, ROWS * self.cols);
        widen(dtype, rows, values);
        for step in &self.steps {
            apply_rows(step, (first, self.cols), values, scratch, dtype);
        }
        let result = if self.allow_nonfinite {
            Ok(())
        } else {
            refuse_overflow(&self.name, (dtype, dtype), rows, values, first * self.cols)
        };
        if result.is_ok() {
            narrow(dtype, values, rows);
        }
        buffers.give_back();
        result
    }
}

/// Stops the save when the merge made an element that was finite NaN or infinite (a
/// huge `lora_alpha`, or a sum past the dtype's range), or one that the cast to `to`
/// would make infinite: naming the tensor and the element, before anything is kept.
fn refuse_overflow(
    name: &str,
    (from, to): (DType, DType),
    before: &[u8],
    after: &[f32],
    first: usize,
) -> Result<(), CopyError> {
    // The largest finite value `to` holds, plus half its last step: past it, a cast
    // rounds to infinity (float32 and bfloat16 share float32's range).
    let limit = if to == DType::F16 {
        65520.0
    } else {
        f32::INFINITY
    };
    // Below the limit means finite too (NaN compares false). The whole band is
    // checked first without stopping early, which the compiler vectorises: an
    // element-by-element loop with an exit took as long as the merge's arithmetic.
    let fits = |v: f32| v.abs() < limit;
    if after.iter().fold(true, |all, &v| all & fits(v)) {
        return Ok(());
    }
    let size = from.size() as usize;
    for (k, v) in after.iter().enumerate() {
        if fits(*v) {
            continue;
        }
        let mut was = [0f32];
        widen(from, &before[k * size..(k + 1) * size], &mut was);
        if was[0].is_finite() {
            return Err(CopyError::Io(io::Error::other(format!(
                "merging the adapter into `{}` makes element {} {} (it was {}): the result does not fit {to}. Nothing was kept; pass --allow-nonfinite to write it anyway",
                crate::text::escaped(name),
                first + k,
                v,
                was[0]
            ))));
        }
    }
    Ok(())
}

/// Little-endian elements of `dtype` to f32 (exact for the three dtypes merged).
fn widen(dtype: DType, bytes: &[u8], out: &mut [f32]) {
    match dtype {
        DType::BF16 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16);
            }
        }
        DType::F16 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
            }
        }
        _ => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
    }
}

/// f32 values (already representable in `dtype`) to little-endian `dtype` bytes.
fn narrow(dtype: DType, values: &[f32], out: &mut [u8]) {
    match dtype {
        DType::BF16 => {
            // The values are bfloat16 already (rounded by the merge): the top half.
            for (v, o) in values.iter().zip(out.chunks_exact_mut(2)) {
                o.copy_from_slice(&((v.to_bits() >> 16) as u16).to_le_bytes());
            }
        }
        DType::F16 => {
            for (v, o) in values.iter().zip(out.chunks_exact_mut(2)) {
                o.copy_from_slice(&f16::from_f32(*v).to_bits().to_le_bytes());
            }
        }
        _ => {
            for (v, o) in values.iter().zip(out.chunks_exact_mut(4)) {
                o.copy_from_slice(&v.to_le_bytes());
            }
        }
    }
}

/// `x` rounded to `dtype` as torch's `.to()` rounds (held as f32).
fn round_to(dtype: DType, x: f32) -> f32 {
    match dtype {
        DType::BF16 => crate::save::cast::round_to_bf16(x),
        DType::F16 => f16::from_f32(x).to_f32(),
        _ => x,
    }
}
